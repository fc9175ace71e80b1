"""Who spoke when, measured: DER and speaker attribution on real conversations.

    python -m bench diarization [--conversations 20] [--wer 4] [--hour] [--snr DB] [--out FILE]
    python -m bench diarization --split 3 [--conversations 20] [--seed 0]

What it runs on:

- the pyannote sample (30 s, two speakers on a telephone line, overlaps; its RTTM);
- ``--conversations`` conversations of 2-5 speakers, 1-10 minutes, built here from real
  recordings of nine distinct voices with known turns: the evaluation corpus's Asterisk
  voices (Allison en-US, June fr-CA, Carlo it-IT, IvrvoiceRU ru-RU), three more Debian
  prompt voices (``asterisk-prompt-es-co``, ``-fr-armelle``, ``-it-menardi-wav``, so two
  French and two Italian voices), the LibriVox reader and JFK. Turns of 1-3 phrases,
  pauses of 0.2-1.2 s, one turn in ten an interruption that overlaps the last by
  0.3-0.8 s. The reference is where each phrase's speech is (its silence trimmed).

``--snr DB`` mixes pink (1/f) noise into the built conversations that many dB below their
speech. Each is diarized without hints and with ``num_speakers``; scored with pyannote.metrics
(DER, collar 0.25 s and 0) and by time-weighted attribution
(``speech_assets.diarization.attribution``): the share of reference speech (one speaker
at a time) whose hypothesis speaker, under the best one-to-one label mapping, is right, a
moment between turns taking the nearest turn's speaker as a word there would. Also: the
diarizer's seconds per audio minute, its start-up (load and warm-up) and RSS added,
peak memory on a 1-hour recording (``--hour``), and transcription WER with and without
``diarize`` through the worker's job path (``--wer N`` English conversations).

``--split N`` measures speakers across pieces instead: each built conversation
through the worker's job path with ``diarize``, unsplit and cut in N pieces whose speakers
are one set for the whole, with and without ``num_speakers``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.eval_corpus import DEFAULT_DIR, fetch, sound_effects, transcripts
from bench.common.machine import describe
from bench.common.machine import line as machine_line
from speech_assets.clips import DATA, JFK_TEXT
from speech_assets.diarization import (
    attribution,
    coverage,
    diarizer_dir,
    pyannote_sample,
    rttm_turns,
)

RATE = 16000
ROOT = Path(__file__).resolve().parents[2]
EXTRA_VOICES = {
    # package, version, sha256, folder under usr/share/asterisk/sounds
    "es_CO": (
        "asterisk-prompt-es-co",
        "0.20070403-2.1",
        "6702696e045514699e87dc8fb70f370717e5df91f821f7bec8dd0df1be008e83",
        "es",
    ),
    "fr_Armelle": (
        "asterisk-prompt-fr-armelle",
        "20070613-2.2",
        "162570b1a9b3512a98f06b89f60c7c17cf1b9b52297315adca9a4e5be728bea3",
        "fr",
    ),
    "it_Menardi": (
        "asterisk-prompt-it-menardi-wav",
        "1:1.4.22+mm20110907-3.1",
        "3094530d98f8758ac275572d59624c41f60969fef883f34f4886d144f3dfeb21",
        "it_IT_f_Menardi",
    ),
}
CORE_VOICES = {
    "en": "en_US_f_Allison",
    "fr": "fr_CA_f_June",
    "it": "it_IT_m_Carlo",
    "ru": "ru_RU_f_IvrvoiceRU",
}
DURATIONS = (60, 90, 120, 150, 180, 240, 300, 420, 600)


@dataclass
class Phrase:
    samples: np.ndarray
    text: str


@dataclass
class Conversation:
    name: str
    samples: np.ndarray
    turns: list[tuple[float, float, str]]
    speakers: int
    text: str = ""
    has_text: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _decode(path: Path) -> np.ndarray:
    import faster_whisper

    return faster_whisper.decode_audio(str(path))


def _trim(x: np.ndarray, floor_db: float = -35.0) -> np.ndarray:
    """The phrase without its leading and trailing silence (20-ms frames)."""
    frames = len(x) // 320
    if frames == 0:
        return x
    rms = np.sqrt((x[: frames * 320].reshape(frames, 320) ** 2).mean(axis=1) + 1e-12)
    loud = np.nonzero(20 * np.log10(rms / (rms.max() + 1e-12)) > floor_db)[0]
    if len(loud) == 0:
        return x[:0]
    return x[loud[0] * 320 : (loud[-1] + 1) * 320]


def _extra_voice(name: str, dest: Path) -> Path:
    import hashlib

    package, version, digest, folder = EXTRA_VOICES[name]
    debs, unpacked = dest / "debs", dest / "x-voices"
    deb = debs / f"{package}_{version.replace(':', '%3a')}_all.deb"
    if not deb.exists():
        debs.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["apt-get", "download", "-qq", f"{package}={version}"],
            cwd=debs,
            check=True,
            capture_output=True,
        )
    got = hashlib.sha256(deb.read_bytes()).hexdigest()
    if got != digest:
        raise RuntimeError(f"{deb.name}: sha256 {got}, expected {digest}")
    target = unpacked / "usr/share/asterisk/sounds" / folder
    if not target.exists():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    return target


def voices(dest: Path = DEFAULT_DIR, per_voice: int = 80, seed: int = 0) -> dict[str, list[Phrase]]:
    """Nine real voices, up to ``per_voice`` phrases each (text where known)."""
    rng = random.Random(seed)
    unpacked = fetch(dest)
    effects = sound_effects(transcripts(unpacked, "en"))
    out: dict[str, list[Phrase]] = {}
    for lang, voice in CORE_VOICES.items():
        texts = transcripts(unpacked, lang)
        folder = unpacked / "usr/share/asterisk/sounds" / voice
        files = sorted(p for p in folder.glob("*.wav") if p.stem in texts and p.stem not in effects)
        rng.shuffle(files)
        out[voice] = _phrases([(p, texts[p.stem]) for p in files], per_voice)
    for name in EXTRA_VOICES:
        folder = _extra_voice(name, dest)
        files = sorted(
            p for p in folder.iterdir() if p.suffix in (".gsm", ".wav") and p.stem not in effects
        )
        rng.shuffle(files)
        out[name] = _phrases([(p, "") for p in files], per_voice)
    libri = sorted((DATA / "librivox").glob("*.wav"))
    out["librivox"] = _phrases([(p, p.with_suffix(".txt").read_text().strip()) for p in libri], 99)
    out["jfk"] = _phrases([(DATA / "jfk.wav", JFK_TEXT)], 1)
    return out


def _phrases(files: list[tuple[Path, str]], limit: int) -> list[Phrase]:
    out = []
    for path, text in files:
        try:
            x = _trim(_decode(path))
        except Exception:  # a few of the packages' files are empty or broken
            continue
        if 0.8 * RATE <= len(x) <= 12 * RATE:
            out.append(Phrase(x / (np.sqrt((x**2).mean()) * 10 + 1e-9), text))
        if len(out) >= limit:
            break
    return out


def conversation(
    name: str, pool: dict[str, list[Phrase]], k: int, seconds: float, rng: random.Random
) -> Conversation:
    """Turns of ``k`` voices until ``seconds`` of audio; see the module's docstring."""
    who = rng.sample(sorted(pool), k)
    pieces: list[tuple[int, np.ndarray, str, str]] = []  # (start sample, audio, voice, text)
    t, last = 0, None
    while t < seconds * RATE:
        speaker = rng.choice([v for v in who if v != last] if k > 1 else who)
        gain = 10 ** (rng.uniform(-3, 3) / 20)
        overlap = last is not None and rng.random() < 0.1
        gap = -int(rng.uniform(0.3, 0.8) * RATE) if overlap else int(rng.uniform(0.2, 1.2) * RATE)
        t = max(0, t + gap)
        for i in range(rng.randint(1, 3)):
            p = rng.choice(pool[speaker])
            pieces.append((t, p.samples * gain, speaker, p.text))
            t += len(p.samples) + (int(rng.uniform(0.15, 0.4) * RATE) if i < 2 else 0)
        last = speaker
    audio = np.zeros(max(s + len(a) for s, a, _, _ in pieces) + RATE // 2, dtype=np.float32)
    for s, a, _, _ in pieces:
        audio[s : s + len(a)] += a.astype(np.float32)
    audio /= max(1.0, float(np.abs(audio).max()) / 0.9)
    turns = [(s / RATE, (s + len(a)) / RATE, v) for s, a, v, _ in pieces]
    text = " ".join(tx for _, _, _, tx in sorted(pieces, key=lambda p: p[0]))
    has_text = all(tx for _, _, _, tx in pieces)
    # The voices that do speak: a short conversation can end before the k-th has a turn
    # (seed 1's conv18: 4 drawn, 3 spoke; its "true count" of 4 was a wrong hint).
    speakers = len({v for _, _, v in turns})
    return Conversation(name, audio, turns, speakers, text, has_text)


def conversations(n: int, pool: dict[str, list[Phrase]], seed: int = 0) -> list[Conversation]:
    rng = random.Random(seed)
    return [
        conversation(f"conv{i:02d}", pool, 2 + i % 4, DURATIONS[i % len(DURATIONS)], rng)
        for i in range(n)
    ]


def _annotation(turns: list[tuple[float, float, str]]) -> Any:
    from pyannote.core import Annotation, Segment

    ann = Annotation()
    for i, (s, e, who) in enumerate(turns):
        ann[Segment(s, e), i] = who
    return ann


def score(conv: Conversation, result: Any) -> dict[str, Any]:
    from pyannote.metrics.diarization import DiarizationErrorRate

    hyp_turns = [(t.start, t.end, t.speaker) for t in result.turns]
    ref, hyp = _annotation(conv.turns), _annotation(hyp_turns)
    minutes = len(conv.samples) / RATE / 60
    return {
        "der": round(float(DiarizationErrorRate(collar=0.25)(ref, hyp)), 4),
        "der_no_collar": round(float(DiarizationErrorRate()(ref, hyp)), 4),
        "attribution": round(attribution(conv.turns, hyp_turns), 4),
        "coverage": round(coverage(conv.turns, hyp_turns), 4),
        "speakers_found": len(result.speakers),
        "snr_db": result.snr_db,
        "seconds": round(result.seconds, 3),
        "s_per_audio_min": round(result.seconds / minutes, 3),
    }


def with_noise(conv: Conversation, snr_db: float, seed: int) -> Conversation:
    """The conversation under pink (1/f) noise, ``snr_db`` below its speech's power (the
    reference turns' samples): a room's hum and hiss rather than the studio silence the
    prompt voices were recorded in."""
    rng = np.random.default_rng(seed)
    n = len(conv.samples)
    spectrum = np.fft.rfft(rng.normal(size=n))
    spectrum /= np.sqrt(np.maximum(np.fft.rfftfreq(n, 1 / RATE), 20.0))
    noise = np.fft.irfft(spectrum, n)
    speech = np.concatenate([conv.samples[int(s * RATE) : int(e * RATE)] for s, e, _ in conv.turns])
    power = float((speech.astype(np.float64) ** 2).mean())
    noise *= np.sqrt(power / 10 ** (snr_db / 10) / float((noise**2).mean()))
    mixed = (conv.samples + noise).astype(np.float32)
    mixed /= max(1.0, float(np.abs(mixed).max()) / 0.9)
    return Conversation(conv.name, mixed, conv.turns, conv.speakers, conv.text, conv.has_text)


def _pyannote_conversation() -> Conversation:
    wav, rttm = pyannote_sample()
    turns = rttm_turns(rttm)
    return Conversation("pyannote-sample", _decode(wav), turns, len({t[2] for t in turns}))


def _start_up(model: Path) -> dict[str, float]:
    """The diarizer's load + warm-up and RSS added, in a fresh process."""
    code = (
        "import time,resource,json;import numpy, onnxruntime, faster_whisper;"
        "r0=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;t=time.perf_counter();"
        f"from handler.inference.speakers.diarizer import load;d=load({str(model)!r});"
        "print(json.dumps({'load_s':time.perf_counter()-t,'rss_added_mib':"
        "(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss-r0)/1024}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {k: round(v, 2) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def _worker_start(model: Path, rounds: int = 3) -> dict[str, Any]:
    """The whole worker's start-up (settings, imports, model load, warm-up) and its RSS,
    with and without WHISPER_DIARIZATION, in fresh processes, alternating; medians."""
    code = (
        "import time,resource,json;t=time.perf_counter();"
        "from handler.settings import load_settings;from handler.startup import start_worker;"
        "w=start_worker(load_settings());"
        "print(json.dumps({'start_s':time.perf_counter()-t,'rss_mib':"
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024,"
        "'diarizer':w.diarizer is not None}))"
    )
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            env = {
                **os.environ,
                "WHISPER_DEVICE": "cpu",
                "WHISPER_DIARIZATION": str(mode == "on"),
                "WHISPER_DIARIZATION_MODEL": str(model),
            }
            out = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                check=True,
                env=env,
                cwd=ROOT,
            )
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        mode: {k: round(float(np.median([r[k] for r in rs])), 2) for k in ("start_s", "rss_mib")}
        for mode, rs in runs.items()
    }


def _hour(model: Path, pool: dict[str, list[Phrase]]) -> dict[str, Any]:
    from handler.inference.speakers import diarizer as diarize
    from handler.inference.speakers.clusters import SpeakerCount

    conv = conversation("hour", pool, 4, 3600, random.Random(7))
    d = diarize.load(str(model))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = d.run(conv.samples, SpeakerCount())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        **score(conv, result),
        "audio_mib": round(conv.samples.nbytes / 2**20, 1),
        "peak_rss_mib": round(peak, 1),
        "peak_added_mib": round(peak - before, 1),
    }


def _wer(convs: list[Conversation], model: Path) -> list[dict[str, Any]]:
    """The worker's own job path, with and without diarize, on the same audio."""
    import base64

    import jiwer

    from handler.inference.speakers.clusters import SpeakerCount
    from handler.pipeline.job import run_job
    from handler.settings import load_settings
    from handler.startup import start_worker
    from speech_assets.clips import wav_bytes

    worker = start_worker(
        load_settings(
            {
                "WHISPER_DEVICE": "cpu",
                "WHISPER_DIARIZATION": "true",
                "WHISPER_DIARIZATION_MODEL": str(model),
            }
        )
    )
    rows = []
    for conv in convs:
        audio = base64.b64encode(wav_bytes(conv.samples)).decode()
        plain = run_job({"audio_base64": audio}, worker)
        # The diarizer after the transcription, then the same job with it in a thread
        # beside (what the worker does on every device): the worker's one switch.
        worker.diarize_beside = False
        try:
            spk = run_job({"audio_base64": audio, "diarize": True}, worker)
        finally:
            worker.diarize_beside = True
        beside = run_job({"audio_base64": audio, "diarize": True}, worker)
        assert worker.diarizer is not None
        alone = worker.diarizer.run(conv.samples, SpeakerCount()).seconds
        row = {
            "name": conv.name,
            "minutes": round(len(conv.samples) / RATE / 60, 2),
            "diff_wer": round(jiwer.wer(plain["text"], spk["text"]), 4),
            "transcribe_s": plain["timings"]["total"],
            "diarized_s": spk["timings"]["total"],
            "diarized_beside_s": beside["timings"]["total"],
            "diarizer_alone_s": round(alone, 3),
        }
        if conv.has_text:
            from bench.common.text import normalise

            ref = normalise(conv.text, "en")
            row["wer_plain"] = round(jiwer.wer(ref, normalise(plain["text"], "en")), 4)
            row["wer_diarize"] = round(jiwer.wer(ref, normalise(spk["text"], "en")), 4)
        rows.append(row)
    return rows


def _split(convs: list[Conversation], model: Path, n: int) -> list[dict[str, Any]]:
    """Speakers across pieces: the worker's job path with ``diarize``, unsplit
    and with ``split: n``, without hints and with ``num_speakers``; attribution and coverage
    of the whole result's segments. The pieces run in this process (a fan-out that calls the
    job path for each piece input): the platform's queue changes nothing measured here.
    Scored on the speaker turns (the RTTM) and on the segments' speakers."""
    import base64

    from handler.pipeline.job import run_job
    from handler.settings import load_settings
    from handler.startup import start_worker
    from speech_assets.clips import wav_bytes

    worker = start_worker(
        load_settings(
            {
                "WHISPER_DEVICE": "cpu",
                "WHISPER_DIARIZATION": "true",
                "WHISPER_DIARIZATION_MODEL": str(model),
            }
        )
    )

    def here(
        inputs: list[dict[str, Any]], cancel: Any, run_here: Any, on_done: Any = None
    ) -> list[dict[str, Any]]:
        outs = [run_job(inp, worker) for inp in inputs]
        if failed := [o for o in outs if "error_code" in o]:
            raise RuntimeError(f"a piece failed: {failed[0]}")
        return [{"output": o, "job_id": f"here-{i}", "tries": 1} for i, o in enumerate(outs)]

    worker.fan_out = here
    rows = []
    for conv in convs:
        audio = base64.b64encode(wav_bytes(conv.samples)).decode()
        row: dict[str, Any] = {
            "name": conv.name,
            "speakers": conv.speakers,
            "minutes": round(len(conv.samples) / RATE / 60, 2),
        }
        for label, extra in (("unsplit", {}), ("split", {"split": n})):
            for hints, count in (("auto", {}), ("given", {"num_speakers": conv.speakers})):
                out = run_job(
                    {
                        "audio_base64": audio,
                        "diarize": True,
                        "output": ["segments", "rttm"],
                        **extra,
                        **count,
                    },
                    worker,
                )
                if "error_code" in out:
                    raise RuntimeError(f"{conv.name} {label} {hints}: {out}")
                hyp = [(s["start"], s["end"], s.get("speaker") or "") for s in out["segments"]]
                turns = [
                    (float(f[3]), float(f[3]) + float(f[4]), f[7])
                    for f in (ln.split() for ln in out["rttm"].splitlines())
                ]
                row[f"{label}_{hints}"] = {
                    "attribution": round(attribution(conv.turns, turns), 4),
                    "segments_attribution": round(attribution(conv.turns, hyp), 4),
                    "coverage": round(coverage(conv.turns, hyp), 4),
                    "speakers_found": len(out.get("speakers") or []),
                    "pieces": len(out.get("pieces") or []) or 1,
                }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def split_table(rows: list[dict[str, Any]], n: int) -> str:
    lines = [
        "| job | hints | attribution of the turns (mean / min) | of the segments "
        "| segments' coverage (mean / min) | speaker count exact "
        "| conversations' turns worse than unsplit (by > 0.01) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in ("unsplit", "split"):
        for hints in ("auto", "given"):
            key = f"{label}_{hints}"
            a = [r[key]["attribution"] for r in rows]
            seg = [r[key]["segments_attribution"] for r in rows]
            cov = [r[key]["coverage"] for r in rows]
            exact = sum(r[key]["speakers_found"] == r["speakers"] for r in rows)
            worse = sum(
                r[key]["attribution"] < r[f"unsplit_{hints}"]["attribution"] - 0.01 for r in rows
            )
            lines.append(
                f"| {'unsplit' if label == 'unsplit' else f'split {n}'} | "
                f"{'none' if hints == 'auto' else 'num_speakers'} | "
                f"{np.mean(a):.3f} / {min(a):.3f} | {np.mean(seg):.3f} / {min(seg):.3f} | "
                f"{np.mean(cov):.3f} / {min(cov):.3f} | "
                f"{exact}/{len(rows)} | {'-' if label == 'unsplit' else worse} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench diarization", description=__doc__)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--wer", type=int, default=0, help="conversations to transcribe")
    parser.add_argument("--hour", action="store_true", help="peak memory on a 1-hour recording")
    parser.add_argument(
        "--seed", type=int, default=0, help="conversations drawn (1: the set tuned on)"
    )
    parser.add_argument(
        "--snr", type=float, default=None, help="pink noise, dB below the built ones' speech"
    )
    parser.add_argument(
        "--split",
        type=int,
        default=0,
        help="instead: the job path with diarize, unsplit and in this many pieces",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/diarization.json"))
    args = parser.parse_args(argv)
    if args.split > 1:
        built = conversations(args.conversations, voices(), args.seed)
        if args.snr is not None:
            built = [with_noise(c, args.snr, i) for i, c in enumerate(built)]
        split_rows = _split(built, diarizer_dir(), args.split)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {"machine": describe(), "split": args.split, "conversations": split_rows}, indent=2
            )
            + "\n"
        )
        print(split_table(split_rows, args.split))
        return 0
    from handler.inference.speakers import diarizer as diarize
    from handler.inference.speakers.clusters import SpeakerCount

    machine = describe()
    model = diarizer_dir()
    report: dict[str, Any] = {
        "machine": machine,
        "start_up": _start_up(model),
        "worker_start": _worker_start(model),
    }
    pool = voices()
    built = conversations(args.conversations, pool, args.seed)
    if args.snr is not None:
        built = [with_noise(c, args.snr, i) for i, c in enumerate(built)]
        report["snr_db"] = args.snr
    convs = [_pyannote_conversation(), *built]
    d = diarize.load(str(model))
    rows = []
    for conv in convs:
        row = {
            "name": conv.name,
            "speakers": conv.speakers,
            "minutes": round(len(conv.samples) / RATE / 60, 2),
        }
        row["auto"] = score(conv, d.run(conv.samples, SpeakerCount()))
        row["given"] = score(conv, d.run(conv.samples, SpeakerCount(exact=conv.speakers)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    report["conversations"] = rows
    if args.hour:
        report["hour"] = _hour(model, pool)
    if args.wer:
        # English voices only (the default model is English-only): Allison, the LibriVox
        # reader and JFK, 2-3 speakers, 1-3 minutes.
        english = {v: pool[v] for v in ("en_US_f_Allison", "librivox", "jfk")}
        rng = random.Random(11)
        wer_convs = [
            conversation(f"en{i:02d}", english, 2 + i % 2, 60 + 60 * (i % 3), rng)
            for i in range(args.wer)
        ]
        report["wer"] = _wer(wer_convs, model)
    machine["load_after"] = describe()["load_1m"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    rows = report["conversations"]
    built = [r for r in rows if r["name"] != "pyannote-sample"]
    lines = [
        machine_line(report["machine"], report["machine"].get("load_after")),
        f"diarizer start-up: {report['start_up']}",
        f"worker start-up (tiny.en, warm-up on), medians: {report['worker_start']}",
        "",
        "| set | hints | attribution (mean / min) | coverage (mean / min) "
        "| DER collar 0.25 (mean) | DER no collar | speaker count exact | s per audio min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    noisy = f" at {report['snr_db']:g} dB SNR" if report.get("snr_db") is not None else ""
    for label, subset in (("pyannote sample", rows[:1]), (f"{len(built)} built{noisy}", built)):
        if not subset:
            continue
        for hints in ("auto", "given"):
            a = [r[hints]["attribution"] for r in subset]
            cov = [r[hints].get("coverage", float("nan")) for r in subset]
            der = [r[hints]["der"] for r in subset]
            der0 = [r[hints]["der_no_collar"] for r in subset]
            exact = sum(r[hints]["speakers_found"] == r["speakers"] for r in subset)
            spm = sum(r[hints]["seconds"] for r in subset) / sum(r["minutes"] for r in subset)
            lines.append(
                f"| {label} | {'none' if hints == 'auto' else 'num_speakers'} | "
                f"{np.mean(a):.3f} / {min(a):.3f} | {np.mean(cov):.3f} / {min(cov):.3f} | "
                f"{np.mean(der):.3f} | {np.mean(der0):.3f} | "
                f"{exact}/{len(subset)} | {spm:.2f} |"
            )
    if "hour" in report:
        lines += ["", f"1-hour recording: {report['hour']}"]
    if "wer" in report:
        lines += [
            "",
            "| conversation | minutes | WER plain | WER diarize | text changed (WER) "
            "| job s plain | diarizer alone s | job s, diarized after | beside |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["wer"]:
            lines.append(
                f"| {r['name']} | {r['minutes']} | {r.get('wer_plain', '-')} | "
                f"{r.get('wer_diarize', '-')} | {r['diff_wer']} | {r['transcribe_s']} | "
                f"{r['diarizer_alone_s']} | {r['diarized_s']} | "
                f"{r['diarized_beside_s']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
