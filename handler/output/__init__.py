"""Results out: formats, subtitle cues, and the offload of results too large for the
platform. Imports nothing of ``inference/``."""
