"""Word times from the forced aligner (``word_alignment``) through the job path, with the real
tiny.en model, the real PocketSphinx aligner and real speech; human-made word boundaries
from praatio's examples (tests/data/words, SOURCES.md). The HTTP face's test is in
test_http.py, the WebSocket face's in test_realtime.py."""

from __future__ import annotations

import base64
import copy
import threading
import time

import numpy as np
import pytest

from handler.contract import SAMPLE_RATE
from handler.errors import Code
from handler.guard import Guard
from handler.inference import align
from handler.pipeline.job import run_job
from handler.pipeline.runtime import Runtime
from speech_assets.clips import clips, read_wav, wav_bytes
from tests.helpers import DATA, b64, make_settings

pytestmark = pytest.mark.model
WORDS = DATA / "words"
LEAD_S = 0.5  # the human clips start at once: a real file has some lead-in


def human_clips() -> list[tuple[np.ndarray, list[tuple[str, float, float]]]]:
    rows = [ln.split("\t") for ln in (WORDS / "boundaries.tsv").read_text().splitlines()[1:]]
    out = []
    for name in dict.fromkeys(r[0] for r in rows):
        pad = np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)
        samples = np.concatenate([pad, read_wav(WORDS / f"{name}.wav"), pad])
        ref = [(w, float(s) + LEAD_S, float(e) + LEAD_S) for n, w, s, e in rows if n == name]
        out.append((samples, ref))
    return out


def job(samples: np.ndarray, **options: object) -> dict[str, object]:
    audio = base64.b64encode(wav_bytes(samples)).decode()
    out = {"audio_base64": audio, "output": ["text", "words", "segments"], **options}
    return {"word_timestamps": True, **out}


def start_errors(worker: Runtime, how: str) -> list[float]:
    errors = []
    for samples, ref in human_clips():
        out = run_job(job(samples, word_alignment=how, language="en"), worker)
        got = out["words"]
        assert [w["word"].strip(" .,").lower() for w in got] == [r[0] for r in ref], got
        errors += [abs(w["start"] - r[1]) for w, r in zip(got, ref, strict=True)]
    return errors


def test_forced_word_starts_are_near_the_human_boundaries(worker: Runtime) -> None:
    forced, whisper = start_errors(worker, "forced"), start_errors(worker, "whisper")
    # Eight hand-labelled words (two sentences): the aligner's starts within 40 ms on
    # average and 80 % within 50 ms; Whisper's own are several times further off.
    assert np.mean(forced) <= 0.040, forced
    assert np.mean(np.array(forced) <= 0.050) >= 0.8, forced
    assert np.mean(whisper) > 2 * np.mean(forced), (whisper, forced)


def test_the_text_and_every_word_are_the_same_with_and_without_alignment(worker: Runtime) -> None:
    for clip in clips():
        plain = run_job(job(clip.samples, word_alignment="whisper"), worker)
        forced = run_job(job(clip.samples, word_alignment="forced"), worker)
        assert forced["text"] == plain["text"]
        assert [w["word"] for w in forced["words"]] == [w["word"] for w in plain["words"]]
        assert [s["text"] for s in forced["segments"]] == [s["text"] for s in plain["segments"]]
        assert plain["word_alignment"] == "whisper" and forced["word_alignment"] == "forced"
        starts = [w["start"] for w in forced["words"]]
        assert starts == sorted(starts)
        assert all(w["start"] <= w["end"] for w in forced["words"])
        assert forced["words"] != plain["words"]  # the times moved
        assert "align" in forced["timings"] and "align" not in plain["timings"]


def test_srt_cues_follow_the_aligned_words(worker: Runtime) -> None:
    out = run_job(
        {
            "audio_base64": b64(DATA / "jfk.wav"),
            "output": ["srt", "words"],
            "word_alignment": "auto",
        },
        worker,
    )
    assert out["word_alignment"] == "forced"
    first = out["words"][0]
    start = out["srt"].split("\n")[1].split(" --> ")[0]
    h, m, rest = start.split(":")
    s, ms = rest.split(",")
    assert int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000 == pytest.approx(first["start"])


def test_an_unknown_method_is_invalid_input_naming_the_values(worker: Runtime) -> None:
    out = run_job({"audio_base64": b64(DATA / "jfk.wav"), "word_alignment": "wav2vec"}, worker)
    assert out["error_code"] == Code.INVALID_INPUT.value and out["retryable"] is False
    assert "word_alignment" in out["error"]
    for value in align.METHODS:
        assert value in out["error"]


def test_silence_and_noise_align_without_a_crash(worker: Runtime) -> None:
    rng = np.random.default_rng(7)
    t = np.arange(4 * SAMPLE_RATE) / SAMPLE_RATE
    for samples in (
        np.zeros(4 * SAMPLE_RATE, np.float32),
        (0.3 * rng.standard_normal(4 * SAMPLE_RATE)).astype(np.float32),
        (0.4 * np.sin(2 * np.pi * 440 * t) * (np.sin(2 * np.pi * 2 * t) > 0)).astype(np.float32),
    ):
        out = run_job(job(samples, word_alignment="forced", vad_filter=False), worker)
        assert "error" not in out, out
        assert all(w["start"] <= w["end"] for w in out["words"])


def test_the_deployment_default_applies_and_a_job_overrides_it(tiny_pool) -> None:
    settings = make_settings(device="cpu", word_alignment="forced")
    worker = Runtime(settings=settings, pool=tiny_pool)
    audio = b64(DATA / "jfk.wav")
    assert run_job({"audio_base64": audio, "output": ["words"]}, worker)["word_alignment"] == (
        "forced"
    )
    out = run_job({"audio_base64": audio, "word_alignment": "whisper"}, worker)
    assert "word_alignment" not in out  # no words asked, none computed
    out = run_job(
        {"audio_base64": audio, "word_timestamps": True, "word_alignment": "whisper"}, worker
    )
    assert out["word_alignment"] == "whisper"


def test_the_engine_decodes_another_jobs_batch_while_a_job_aligns(worker: Runtime) -> None:
    """The pass holds no model slot and no batch: job A's alignment waits (here, on
    purpose) until job B, sent after A finished decoding, has been transcribed through the
    engine. Were the pass inside A's slot or batch, B could not finish and A would time out."""
    b_done = threading.Event()
    entered = threading.Event()
    real = align.Aligner.align

    def waiting(self, segments, samples, languages, guard):  # type: ignore[no-untyped-def]
        entered.set()
        assert b_done.wait(120), "job B did not finish while job A aligned"
        return real(self, segments, samples, languages, guard)

    results: dict[str, dict] = {}
    audio = b64(DATA / "jfk.wav")
    orig, align.Aligner.align = align.Aligner.align, waiting  # type: ignore[method-assign]
    try:
        a = threading.Thread(
            target=lambda: results.setdefault(
                "a", run_job({"audio_base64": audio, "word_alignment": "forced"}, worker)
            )
        )
        a.start()
        assert entered.wait(120)
        results["b"] = run_job({"audio_base64": audio, "batch_size": 8}, worker)
        b_done.set()
        a.join(180)
    finally:
        align.Aligner.align = orig  # type: ignore[method-assign]
    assert "error" not in results["b"] and results["b"]["batch_sizes"]
    assert results["a"]["word_alignment"] == "forced"


def test_cancel_reaches_the_alignment_pass(worker: Runtime) -> None:
    cancel = threading.Event()
    real = align.force_align  # the test stops the pass between two segments

    def cancelling(*args):  # type: ignore[no-untyped-def]
        cancel.set()
        return real(*args)

    align.force_align = cancelling
    try:
        samples = np.concatenate([c.samples for c in clips()[:3]])
        out = run_job(job(samples, word_alignment="forced"), worker, cancel=cancel)
    finally:
        align.force_align = real
    assert out["error_code"] == Code.CANCELLED.value


def test_words_the_dictionary_cannot_say_keep_their_place_and_order() -> None:
    aligner = align.Aligner(1)
    rate = SAMPLE_RATE
    jfk = read_wav(DATA / "jfk.wav")
    with aligner.decoder(Guard()) as dec:
        assert align.spoken(dec, "Country,") == ["country"]
        assert align.spoken(dec, "1961") == ["one", "nine", "six", "one"]
        assert align.spoken(dec, "Dashwoodly")  # split into dictionary words
        assert align.spoken(dec, "日本") is None
    words = ["And", "so", "my", "日本", "Americans,", "1961", "not"]
    seg = {
        "id": 0,
        "start": 0.0,
        "end": 4.6,
        "text": " ".join(words),
        "words": [
            {"word": " " + w, "start": 0.6 * i, "end": 0.6 * i + 0.5, "probability": 0.9}
            for i, w in enumerate(words)
        ],
    }
    before = copy.deepcopy(seg)
    t = time.perf_counter()
    outcome = aligner.align([seg], jfk[: int(4.6 * rate)], ["en"], Guard())  # type: ignore[list-item]
    assert time.perf_counter() - t < 60
    assert [w["word"] for w in seg["words"]] == [w["word"] for w in before["words"]]
    starts = [w["start"] for w in seg["words"]]
    assert starts == sorted(starts) and all(w["start"] <= w["end"] for w in seg["words"])
    assert outcome.kept >= 2 and outcome.method == {"en": "forced"}


def test_a_long_recording_aligns_one_window_at_a_time(worker: Runtime) -> None:
    """Five minutes of words (one decode of JFK's, tiled) align with the process's memory
    flat: the pass holds one segment's window, not the recording (bench word-times runs
    the same on two hours)."""
    import psutil

    from handler.inference import transcribe

    jfk = read_wav(DATA / "jfk.wav")
    model = worker.pool.get(None)
    with worker.pool.acquire(model, None) as (instance, _):
        tr = transcribe.run(instance, jfk, {"word_timestamps": True, "language": "en"})
    seconds = len(jfk) / SAMPLE_RATE
    reps = int(5 * 60 / seconds)
    samples = np.tile(jfk, reps)
    tiled = []
    for r in range(reps):
        for seg in copy.deepcopy(tr.segments):
            seg["start"] += r * seconds
            seg["end"] += r * seconds
            for w in seg["words"] or []:
                w["start"] += r * seconds
                w["end"] += r * seconds
            tiled.append(seg)
    aligner = align.Aligner(1)
    aligner.warm()
    proc = psutil.Process()
    before = proc.memory_info().rss
    outcome = aligner.align(tiled, samples, ["en"] * len(tiled), Guard())
    grown = (proc.memory_info().rss - before) / 2**20
    assert outcome.aligned >= 0.9 * (outcome.aligned + outcome.kept)
    assert grown < 30, f"{grown:.1f} MB"
