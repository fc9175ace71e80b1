"""Repetition loops (``loop_guard``): found in a transcript's words, decoded again without
the previous text, or collapsed; the real tiny.en model, made to loop by a ``prefix`` that
repeats a phrase (the one way to make a real model loop on demand)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from handler.inference import loops
from handler.pipeline.job import run_job
from handler.pipeline.runtime import Runtime
from speech_assets.clips import clips, read_wav, wav_bytes
from tests.helpers import DATA, JFK_TEXT, b64, make_settings, wer

LOOP = "Thank you. Thank you. Thank you. Thank you. Thank you."


def words(text: str) -> list[str]:
    return text.split()


def test_a_phrase_four_times_or_a_word_six_times_is_a_loop() -> None:
    assert loops.find(words("thank you thank you thank you thank you and so")) == [
        loops.Loop(0, 2, 4)
    ]
    assert loops.find(words("no, no, no, I said")) == []
    assert loops.find(words("very very very very very very good")) == [loops.Loop(0, 1, 6)]
    assert loops.find(words("a b c. a b c. a b c. end")) == []  # three times is speech
    long = "the cat sat on the mat. " * 50
    assert loops.find(words("so " + long + "done")) == [loops.Loop(1, 6, 50)]


def seg(i: int, text: str, start: float) -> dict:
    ws = text.split()
    return {
        "id": i,
        "start": start,
        "end": start + len(ws),
        "text": " " + text,
        "words": [
            {"word": " " + w, "start": start + k, "end": start + k + 0.9, "probability": 1.0}
            for k, w in enumerate(ws)
        ],
    }


def test_collapse_keeps_the_first_unit_and_every_other_word_in_order() -> None:
    segments = [seg(1, "hello there", 0), seg(2, "okay okay okay okay okay okay", 2)]
    segments.append(seg(3, "okay okay bye", 8))
    found = loops.find(loops.segment_words(segments)[0])  # type: ignore[arg-type]
    assert found == [loops.Loop(2, 1, 8)]
    out = loops.collapse(segments, found[0])  # type: ignore[arg-type]
    assert [s["text"] for s in out] == [" hello there", " okay", " bye"]
    assert [w["word"] for s in out for w in s["words"]] == [" hello", " there", " okay", " bye"]
    assert out[1]["end"] == out[1]["words"][-1]["end"]


@pytest.mark.model
def test_a_loop_is_decoded_again_without_the_previous_text(worker: Runtime) -> None:
    # forced word times keep the job's samples as they are, so the stretch can be decoded again
    job = {"audio_base64": b64(DATA / "jfk.wav"), "prefix": LOOP, "word_alignment": "forced"}
    out = run_job(job, worker)
    assert not loops.find(out["text"].split()), out["text"]
    assert wer(JFK_TEXT, out["text"]) < 0.15
    assert any("decoded again" in w for w in out["warnings"]), out["warnings"]
    assert [s["id"] for s in out["segments"]] == list(range(1, len(out["segments"]) + 1))


@pytest.mark.model
def test_a_loop_in_speech_gathered_in_place_is_decoded_again(worker: Runtime) -> None:
    """A job decoded alone moves the VAD's speech to the front of its samples (memory):
    the stretch is read back from there, as the model first heard it."""
    audio = np.concatenate([np.zeros(3 * 16000, np.float32), read_wav(DATA / "jfk.wav")])
    job = {"audio_base64": base64.b64encode(wav_bytes(audio)).decode(), "prefix": LOOP}
    out = run_job({**job, "word_timestamps": True, "output": ["text", "words"]}, worker)
    assert any("decoded again" in w for w in out["warnings"]), out["warnings"]
    assert not loops.find(out["text"].split()) and wer(JFK_TEXT, out["text"]) < 0.15
    # the times are the recording's (JFK begins 3 s in, after silence the VAD dropped), as
    # the same job without the loop times them
    plain = run_job({**job, "prefix": None, "word_timestamps": True, "output": ["words"]}, worker)
    assert abs(out["words"][0]["start"] - plain["words"][0]["start"]) < 0.3, out["words"][:2]
    assert out["words"][0]["start"] > 2.5
    assert out["words"][-1]["end"] <= len(audio) / 16000


def test_a_stretch_of_gathered_speech_maps_back_to_the_recording() -> None:
    from handler.inference.transcribe import Transcript
    from handler.pipeline import repeats

    rate = 16000
    spans = [(1.0, 2.0), (5.0, 7.0)]
    gathered = np.concatenate([np.full(rate, 1.0), np.full(2 * rate, 2.0)]).astype(np.float32)
    tr = Transcript([], "en", 1.0, 0.0, speech=spans, gathered=True)
    clip, pieces = repeats.stretch(gathered, tr, 1.5, 6.0)
    assert len(clip) == int(0.6 * rate) + int(1.1 * rate)
    assert set(clip[: int(0.6 * rate)]) == {1.0} and set(clip[int(0.6 * rate) :]) == {2.0}
    assert repeats.in_recording(0.0, pieces) == 1.4
    assert repeats.in_recording(0.6, pieces) == 5.0
    assert repeats.in_recording(1.7, pieces) == 6.1


@pytest.mark.model
def test_a_loop_is_collapsed_when_it_cannot_be_decoded_again(tiny_pool) -> None:
    settings = make_settings(device="cpu", loop_redecode_s="0")
    worker = Runtime(settings=settings, pool=tiny_pool)
    out = run_job({"audio_base64": b64(DATA / "jfk.wav"), "prefix": LOOP}, worker)
    assert out["text"].count("Thank you") == 1, out["text"]
    assert any("collapsed to one" in w and "x5" in w for w in out["warnings"]), out["warnings"]
    off = run_job(
        {"audio_base64": b64(DATA / "jfk.wav"), "prefix": LOOP, "loop_guard": False}, worker
    )
    assert off["text"].count("Thank you") == 5 and not off.get("warnings")


@pytest.mark.model
def test_clean_speech_is_unchanged_by_the_guard(worker: Runtime) -> None:
    for clip in clips():
        audio = b64(DATA / "jfk.wav") if clip.name == "jfk" else None
        if audio is None:
            import base64

            audio = base64.b64encode(clip.wav_bytes()).decode()
        on = run_job({"audio_base64": audio}, worker)
        off = run_job({"audio_base64": audio, "loop_guard": False}, worker)
        assert on["text"] == off["text"] and on["segments"] == off["segments"]
        assert not [w for w in on.get("warnings", []) if "loop" in w]


JFK_CUTS = {"and so": (0.0, 0.95), "my fellow Americans": (0.95, 2.2), "ask...": (7.7, 11.0)}
"""Where JFK's words lie in tests/data/jfk.wav (its forced word times, rounded outward)."""


def said_again(times: int = 5) -> np.ndarray:
    """JFK's "And so, my fellow Americans" with "my fellow Americans" really said ``times``
    times, 0.4 s apart, then "ask what you can do for your country": a repetition in the
    speech itself, as a voice agent's caller ("hello? hello?") or a reading of a list
    makes it."""
    jfk = read_wav(DATA / "jfk.wav")

    def cut(name: str) -> np.ndarray:
        a, b = JFK_CUTS[name]
        return jfk[int(a * 16000) : int(b * 16000)]

    gap = np.zeros(int(0.4 * 16000), np.float32)
    said = [np.concatenate([cut("my fellow Americans"), gap]) for _ in range(times)]
    return np.concatenate([cut("and so"), *said, cut("ask...")])


@pytest.mark.model
def test_a_phrase_the_speaker_really_repeats_is_kept(worker: Runtime) -> None:
    """Found as a loop (x5) and still there decoded afresh, it is heard one occurrence at
    a time: each says it, so no words are dropped (the guard collapsed it before)."""
    job = {"audio_base64": base64.b64encode(wav_bytes(said_again())).decode()}
    off = run_job({**job, "loop_guard": False}, worker)
    assert off["text"].lower().count("my fellow americans") == 5, off["text"]
    out = run_job(job, worker)
    assert out["text"] == off["text"] and not out.get("warnings"), out
    timed = run_job({**job, "word_timestamps": True, "output": ["text", "words"]}, worker)
    assert [w["word"] for w in timed["words"]].count(" fellow") == 5, timed["text"]


def still_looping(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """The second decode made to loop again (a model that loops on its own cannot be made
    to on demand: this is the one part substituted), its words spread evenly over the
    stretch; the occurrences are heard before it by the real model. Returns the windows
    heard."""
    from handler.pipeline import repeats

    heard: list[tuple[float, float]] = []
    real_decode = repeats._decode

    def again(plan, tr, samples, worker, call, span):  # noqa: ANN001, ANN202
        start, end = span[2], span[3]
        step = (end - start) / 12
        words = [
            {"word": w, "start": start + i * step, "end": start + (i + 1) * step, "probability": 1}
            for i, w in enumerate([" Thank", " you."] * 6)
        ]
        text = "".join(w["word"] for w in words)
        return [{"id": 1, "start": start, "end": end, "text": text, "words": words}]

    def decode(plan, tr, samples, worker, call, window, first, timed):  # noqa: ANN001, ANN202
        heard.append(window)
        return real_decode(plan, tr, samples, worker, call, window, first, timed)

    monkeypatch.setattr(repeats, "_decode_again", again)
    monkeypatch.setattr(repeats, "_decode", decode)
    return heard


@pytest.mark.model
def test_a_loop_the_speech_does_not_say_is_collapsed(worker: Runtime, monkeypatch) -> None:
    heard = still_looping(monkeypatch)
    out = run_job({"audio_base64": b64(DATA / "jfk.wav"), "prefix": LOOP}, worker)
    # heard first: the first two occurrences alone are JFK's other words (one may be
    # misheard, not two), so the stretch is decoded again, loops again, and is collapsed
    assert len(heard) == 2, heard
    assert out["text"].count("Thank you") == 1, out["text"]
    assert any("collapsed to one" in w for w in out["warnings"]), out["warnings"]


@pytest.mark.model
def test_a_loop_over_noise_is_collapsed(worker: Runtime, monkeypatch) -> None:
    """No speech under it: heard alone with the VAD on, each occurrence is nothing."""
    heard = still_looping(monkeypatch)
    noise = (np.random.default_rng(7).standard_normal(8 * 16000) * 0.05).astype(np.float32)
    job = {"audio_base64": base64.b64encode(wav_bytes(noise)).decode(), "prefix": LOOP}
    out = run_job({**job, "vad_filter": False}, worker)
    assert heard and out["text"].count("Thank you") == 1, out["text"]
    assert any("collapsed to one" in w for w in out["warnings"]), out["warnings"]


def test_occurrences_are_heard_in_windows_cut_where_it_is_quiet() -> None:
    from handler.pipeline import repeats

    segments = [seg(1, "a b a b a b a b a b", 0.0)]  # 10 words, 0-9.9 s: 5 slots of 1.98 s
    loop = loops.find(loops.segment_words(segments)[0])[0]  # type: ignore[arg-type]
    windows = repeats.occurrences(segments, loop, lambda t, r: t)  # type: ignore[arg-type]
    # occurrences 0, 1, 3 and 4 (first and last among them), each its slot +- half a slot
    assert windows is not None
    flat = [t for window in windows for t in window]
    assert flat == pytest.approx([0.0, 2.97, 0.99, 4.95, 4.95, 8.91, 6.93, 10.89])
    snapped = repeats.occurrences(segments, loop, lambda t, r: t + r)  # type: ignore[arg-type]
    assert snapped and snapped[0] == pytest.approx((0.495, 3.465))  # moved up to slot / 4
    assert repeats.said_in(["my", "fellow", "americans"], ["and", "my", "fellow", "american"])
    assert not repeats.said_in(["thank", "you"], ["ask", "not", "what"])
    assert not repeats.said_in(["no"], [])
    # untimed segments: each word its share of the segment's time by characters (with its space)
    untimed = [{"id": 1, "start": 2.0, "end": 4.0, "text": " abc abc", "words": None}]
    assert repeats.word_times(untimed) == [(2.0, 3.0), (3.0, 4.0)]  # type: ignore[arg-type]


def test_loop_guard_takes_a_json_boolean_only(worker: Runtime) -> None:
    out = run_job({"audio_base64": b64(DATA / "jfk.wav"), "loop_guard": "no"}, worker)
    assert out["error_code"] == "INVALID_INPUT" and "loop_guard" in out["error"]
