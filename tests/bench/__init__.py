"""Tests of the bench itself (python -m bench): every other test needs no bench."""
