"""Real speech and real models for the tests and the benches, shared by both.

``clips``: the committed JFK and LibriVox recordings (tests/data) with their references,
longer concatenations of them, and WER; ``models``: the Whisper models that install from
PyPI, assembled and hash-checked. Neither the worker nor its image uses this package; the
tests import it instead of ``bench`` (tests/test_layout.py keeps the two apart).
"""
