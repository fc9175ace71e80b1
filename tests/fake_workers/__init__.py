"""Tiny runpod SDK workers used only to test the emulator itself."""
