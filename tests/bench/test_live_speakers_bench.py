"""``python -m bench live-speakers``'s turns (bench/accuracy/live_speakers.py): a barge-in
mixes the next voice over a turn's end, and only where another voice speaks next."""

from __future__ import annotations

import numpy as np


def _conversation():
    from bench.accuracy.diarization import RATE, Conversation

    samples = np.zeros(8 * RATE, dtype=np.float32)
    samples[0 : 2 * RATE] = 0.1  # A
    samples[3 * RATE : 5 * RATE] = 0.2  # A again
    samples[6 * RATE : 8 * RATE] = 0.3  # B
    turns = [(0.0, 2.0, "A"), (3.0, 5.0, "A"), (6.0, 8.0, "B")]
    return Conversation("t", samples, turns, 2), RATE


def test_turns_are_the_said_spans_without_a_barge_in() -> None:
    from bench.accuracy.live_speakers import turn_pieces

    conv, rate = _conversation()
    pieces = turn_pieces(conv)
    assert [len(p) for p in pieces] == [2 * rate] * 3
    assert all(np.allclose(p, v) for p, v in zip(pieces, (0.1, 0.2, 0.3), strict=True))


def test_a_barge_in_mixes_the_next_voice_over_the_end_of_a_turn() -> None:
    from bench.accuracy.live_speakers import turn_pieces

    conv, rate = _conversation()
    pieces = turn_pieces(conv, overlap_s=0.5)
    assert [len(p) for p in pieces] == [2 * rate] * 3
    assert np.allclose(pieces[0], 0.1)  # A then A: no barge-in
    assert np.allclose(pieces[1][: -rate // 2], 0.2)
    assert np.allclose(pieces[1][-rate // 2 :], 0.5)  # B's first half second over A's last
    assert np.allclose(pieces[2], 0.3)  # the last turn: nobody after it
    assert np.allclose(conv.samples[3 * rate : 5 * rate], 0.2)  # the conversation unchanged
