"""``python -m bench flux-eager``'s measure (bench/speed/flux_eager.py): each clip's time
runs from the chunk that held its last word to the EndOfTurn of the last turn that began
in it, and to that turn's last EagerEndOfTurn."""

from __future__ import annotations

from typing import Any


def _info(event: str, turn: int, transcript: str = "", start_s: float = 0.0) -> dict[str, Any]:
    return {"type": "TurnInfo", "event": event, "turn_index": turn, "transcript": transcript,
            "audio_window_start": start_s}  # fmt: skip


def test_each_clip_is_timed_from_its_last_word_sent_to_its_last_turns_end() -> None:
    from bench.speed.flux_eager import latencies

    sent = {100 * n: 10.0 + n / 10 for n in range(1, 80)}  # chunk ending at n*100 ms
    got = [
        (10.2, _info("StartOfTurn", 0, start_s=0.5)),
        (10.9, _info("EagerEndOfTurn", 0, "a")),
        (11.0, _info("TurnResumed", 0)),
        (11.6, _info("EagerEndOfTurn", 0, "a b")),
        (11.8, _info("EndOfTurn", 0, "a b")),
        (13.0, _info("StartOfTurn", 1, start_s=2.9)),  # the second clip, cut in two turns
        (14.7, _info("EndOfTurn", 1, "c")),
        (15.0, _info("StartOfTurn", 2, start_s=4.6)),
        (16.0, _info("EndOfTurn", 2, "d")),
    ]
    out = latencies(sent, got, spans=[(500, 1250), (3000, 5500)])
    assert out["turns"] == 3 and out["text"] == "a b c d"
    assert [round(x, 3) for x in out["to_end"]] == [0.5, 0.5]  # 11.8 - 11.3; 16.0 - 15.5
    assert [round(x, 3) for x in out["to_eager"]] == [0.3]  # the last one, turn 0's only
    assert (out["eager"], out["resumed"]) == (2, 1)


def test_the_recording_says_where_each_clip_lies() -> None:
    import numpy as np

    from bench.speed.flux_eager import RATE, recording

    class Clip:
        def __init__(self, seconds: float) -> None:
            self.samples = np.ones(int(seconds * RATE), np.float32) * 0.5

    pcm, spans = recording([Clip(1.0), Clip(2.0)])  # type: ignore[list-item]
    assert spans == [(500, 1500), (3000, 5000)]  # 0.5 s lead, 1 s, 1.5 s gap, 2 s
    assert len(pcm) == 2 * int((0.5 + 1 + 1.5 + 2 + 1.5) * RATE)
