"""The GPU check's loop mark, on text (its run on the CPU is tests/test_engine.py's)."""

from __future__ import annotations

from bench.speed.gpu_check import max_repeats


def test_a_repetition_loop_is_counted_and_real_speech_is_not() -> None:
    speech = "and so my fellow americans ask not what your country can do for you"
    assert max_repeats(speech) == 1
    assert max_repeats("so so I said") == 2
    loop = "we need to talk about this " + "thank you so much " * 300 + "bye"
    assert max_repeats(loop) == 300
    assert max_repeats("Thank you. " + "I'm sorry. " * 40) == 40
