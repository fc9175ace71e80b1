"""``python -m bench flux-eager``'s measure (bench/speed/flux_eager.py): each turn's time
runs from the chunk that held its clip's last word to its EndOfTurn and its last
EagerEndOfTurn, on its own turn only."""

from __future__ import annotations

from typing import Any


def _info(event: str, turn: int, transcript: str = "") -> dict[str, Any]:
    return {"type": "TurnInfo", "event": event, "turn_index": turn, "transcript": transcript}


def test_each_turn_is_timed_from_its_last_word_sent() -> None:
    from bench.speed.flux_eager import latencies

    sent = {100 * n: 10.0 + n / 10 for n in range(1, 60)}  # chunk ending at n*100 ms
    got = [
        (10.2, _info("StartOfTurn", 0)),
        (10.9, _info("EagerEndOfTurn", 0, "a")),
        (11.0, _info("TurnResumed", 0)),
        (11.6, _info("EagerEndOfTurn", 0, "a b")),
        (11.8, _info("EndOfTurn", 0, "a b")),
        (13.0, _info("StartOfTurn", 1)),
        (14.7, _info("EndOfTurn", 1, "c")),
    ]
    out = latencies(sent, got, ends=[1250, 4000])  # the 1300-ms chunk, the 4000-ms one
    assert out["turns"] == 2 and out["text"] == "a b c"
    assert [round(x, 3) for x in out["to_end"]] == [0.5, 0.7]
    assert [round(x, 3) for x in out["to_eager"]] == [0.3]  # the last one, turn 0's only
    assert (out["eager"], out["resumed"]) == (2, 1)


def test_the_recording_says_where_each_clip_ends() -> None:
    import numpy as np

    from bench.speed.flux_eager import RATE, recording

    class Clip:
        def __init__(self, seconds: float) -> None:
            self.samples = np.ones(int(seconds * RATE), np.float32) * 0.5

    pcm, ends = recording([Clip(1.0), Clip(2.0)])  # type: ignore[list-item]
    assert ends == [1500, 5000]  # 0.5 s lead, 1 s, 1.5 s gap, 2 s
    assert len(pcm) == 2 * int((0.5 + 1 + 1.5 + 2 + 1.5) * RATE)
