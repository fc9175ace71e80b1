"""Untrusted bytes in: the audio sources (base64, http(s) behind the SSRF guard, s3) and
bounded decoding. Imports nothing of ``inference/``, and ``inference/`` nothing of this."""
