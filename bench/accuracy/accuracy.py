"""Accuracy: the worker's job pipeline beside plain faster-whisper, same files, same run.

``python -m bench accuracy`` runs the evaluation corpus (bench.common.eval_corpus) through

- ``plain``: plain faster-whisper with its own defaults (``WhisperModel.transcribe(path)``:
  its own decoder, beam 5, no VAD, language detected), and
- every ``--config NAME=JSON`` (job options; default: ``worker`` = the worker's defaults),
  each through the worker's own ``run_job`` with one loaded model,

and prints WER per language and per group (jiwer, after Whisper's normalisers: the
English one for English, the basic one with accents folded and digits written as words
(num2words) for the rest; CER for languages written without spaces), the real-time
factor, language-detection accuracy, and the files whose outcome differs most from plain
(empty output, hallucination: much longer than the reference or repeated phrases, wrong
language). ``--per-language N`` samples N prompts per language (the hard cases and the
read speech are always in).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import jiwer

from bench.common.eval_corpus import DEFAULT_DIR, FetchError, Item, build, describe
from bench.common.machine import describe as describe_machine
from bench.common.machine import stamp
from bench.common.text import normalise

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    item: Item
    text: str
    language: str | None
    seconds: float
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return normalise(self.item.text, self.item.language or "en")

    @property
    def hyp(self) -> str:
        return normalise(self.text, self.item.language or "en")


@dataclass
class Run:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)


# Written without spaces between words: scored per character (CER), as published figures are.
CER_LANGUAGES = {"zh", "ja", "th", "lo", "my", "km", "bo", "yue"}


def _units(text: str, language: str) -> str:
    return " ".join(text.replace(" ", "")) if language in CER_LANGUAGES else text


def wer_of(outcomes: list[Outcome]) -> float | None:
    """Word error rate over the outcomes with a reference; character error rate for the
    files in a language of CER_LANGUAGES (a mixed group counts words and characters)."""
    pairs = [
        (_units(o.ref, o.item.language), _units(o.hyp, o.item.language)) for o in outcomes if o.ref
    ]
    if not pairs:
        return None
    refs, hyps = zip(*pairs, strict=True)
    out = jiwer.process_words(list(refs), [h or "<empty>" for h in hyps])
    return out.wer


def is_hallucination(o: Outcome) -> bool:
    ref, hyp = o.ref.split(), o.hyp.split()
    if not ref:
        return bool(hyp)
    if len(hyp) > 2 * len(ref) + 3:
        return True
    grams = [" ".join(hyp[i : i + 3]) for i in range(max(0, len(hyp) - 2))]
    return any(grams.count(g) >= 3 for g in set(grams))


def run_plain(model: Any, items: list[Item], progress: Callable[[str], None]) -> Run:
    run = Run("plain")
    for i, it in enumerate(items):
        t = time.perf_counter()
        segments, info = model.transcribe(str(it.path))
        text = " ".join(s.text.strip() for s in segments)
        run.outcomes.append(Outcome(it, text, info.language, time.perf_counter() - t))
        progress(f"plain {i + 1}/{len(items)}")
    return run


def run_worker(
    name: str,
    worker: Any,
    options: dict[str, Any],
    items: list[Item],
    progress: Callable[[str], None],
) -> Run:
    from handler.pipeline.job import run_job

    run = Run(name)
    for i, it in enumerate(items):
        job = {"audio_base64": base64.b64encode(it.path.read_bytes()).decode(), "output": ["text"]}
        for k, v in options.items():
            if v != "$language":
                job[k] = v
            elif it.language:  # no language for the no-speech files: detected
                job[k] = it.language
        t = time.perf_counter()
        out = run_job(job, worker)
        dt = time.perf_counter() - t
        if "error" in out:
            run.outcomes.append(Outcome(it, "", None, dt, out["error_code"]))
        else:
            run.outcomes.append(
                Outcome(
                    it,
                    out["text"],
                    out.get("language"),
                    dt,
                    warnings=list(out.get("warnings") or []),
                )
            )
        progress(f"{name} {i + 1}/{len(items)}")
    return run


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _is_language(lang: str, o: Outcome) -> bool:
    return o.item.language == lang


def _in_group(group: str, o: Outcome) -> bool:
    return o.item.group == group


def table(runs: list[Run], audio_s: float) -> str:
    names = [r.name for r in runs]
    lines = ["| group | files | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]

    def row(label: str, pick: Callable[[Outcome], bool]) -> None:
        chosen = [[o for o in r.outcomes if pick(o)] for r in runs]
        if not chosen[0]:
            return
        cells = [_fmt(wer_of(c)) for c in chosen]
        lines.append(f"| {label} | {len(chosen[0])} | " + " | ".join(cells) + " |")

    langs = sorted({o.item.language for o in runs[0].outcomes if o.item.language})
    for lang in langs:
        unit = ", CER" if lang in CER_LANGUAGES else ""
        row(f"{lang} (all{unit})", partial(_is_language, lang))
    groups = sorted({o.item.group for o in runs[0].outcomes})
    for g in groups:
        if g != "no_speech":
            row(g, partial(_in_group, g))
    row("**all**", lambda o: bool(o.ref))
    halluc = [sum(is_hallucination(o) for o in r.outcomes) for r in runs]
    lines.append("| hallucinated files | | " + " | ".join(map(str, halluc)) + " |")
    nospeech = [sum(bool(o.hyp) for o in r.outcomes if o.item.group == "no_speech") for r in runs]
    lines.append("| text on no-speech files | | " + " | ".join(map(str, nospeech)) + " |")
    detect = []
    for r in runs:
        judged = [o for o in r.outcomes if o.item.language and o.language]
        ok = sum(o.language == o.item.language for o in judged)
        detect.append(f"{ok}/{len(judged)}")
    lines.append("| language right | | " + " | ".join(detect) + " |")
    rtf = [sum(o.seconds for o in r.outcomes) / audio_s for r in runs]
    lines.append("| real-time factor | | " + " | ".join(f"{x:.3f}" for x in rtf) + " |")
    return "\n".join(lines)


def detection_table(files: dict[str, list[dict[str, Any]]]) -> str:
    """Language detection per language and group (short clips apart), from the JSON rows:
    right / judged files per run (files whose language the run reported)."""
    names = list(files)
    first = files[names[0]]
    keys = sorted({(r["language"], r["group"]) for r in first if r["language"]})
    lines = [
        "| language | group | files | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for lang, group in keys:
        cells = []
        for name in names:
            rows = [r for r in files[name] if (r["language"], r["group"]) == (lang, group)]
            judged = [r for r in rows if r["detected"]]
            right = sum(r["detected"] == lang for r in judged)
            cells.append(f"{right}/{len(judged)}")
        n = sum(1 for r in first if (r["language"], r["group"]) == (lang, group))
        lines.append(f"| {lang} | {group} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dropped_speech(runs: list[Run]) -> str:
    """How often the worker's warning of speech without a segment fired, per run:
    on clean single-language files it should be near zero."""
    lines = ["speech-without-a-segment warning (files / files with speech):"]
    for run in runs:
        if run.name == "plain":
            continue
        spoken = [o for o in run.outcomes if o.ref]
        fired = [o for o in spoken if any("got no segment" in w for w in o.warnings)]
        names = ", ".join(o.item.path.name for o in fired[:6])
        listed = f" ({names})" if names else ""
        lines.append(f"- {run.name}: {len(fired)} / {len(spoken)}{listed}")
    return "\n".join(lines)


def _row(o: Outcome) -> dict[str, Any]:
    return {
        "file": o.item.path.name,
        "group": o.item.group,
        "language": o.item.language,
        "detected": o.language,
        "ref": o.ref,
        "hyp": o.hyp,
        "error": o.error,
        "seconds": round(o.seconds, 3),
    }


def _rows(runs: list[Run]) -> dict[str, list[dict[str, Any]]]:
    return {r.name: [_row(o) for o in r.outcomes] for r in runs}


def worst(runs: list[Run], n: int = 8) -> str:
    base = {o.item.path: o for o in runs[0].outcomes}
    rows = []
    for r in runs[1:]:
        for o in r.outcomes:
            b = base[o.item.path]
            if not o.ref:
                continue
            d = (wer_of([o]) or 0) - (wer_of([b]) or 0)
            why = []
            if not o.hyp:
                why.append("empty")
            if is_hallucination(o):
                why.append("hallucination")
            if o.language and o.item.language and o.language != o.item.language:
                why.append(f"language {o.language}")
            rows.append((d, r.name, o.item.path.name, o.item.group, ", ".join(why)))
    rows.sort(reverse=True)
    out = ["| config | file | group | WER - plain | why |", "|---|---|---|---|---|"]
    out += [f"| {c} | {f} | {g} | {100 * d:+.0f} | {w} |" for d, c, f, g, w in rows[:n]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench accuracy", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--per-language", type=int, default=40, help="prompts per language (0: all)"
    )
    parser.add_argument(
        "--model", default="base", help="base (PyPI, multilingual), tiny.en or a folder"
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help='job options, e.g. novad=\'{"vad_filter": false}\'; "$language" '
        'stands for the file\'s language; "$env": {...} sets worker '
        "settings (repeatable)",
    )
    parser.add_argument("--languages", help="comma-separated subset, e.g. en,es")
    parser.add_argument("--no-plain", action="store_true", help="skip plain faster-whisper")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "accuracy.json"))
    parser.add_argument(
        "--detection-of", metavar="JSON", help="print the detection table of a saved run and exit"
    )
    args = parser.parse_args(argv)
    if args.detection_of:
        print(detection_table(json.loads(Path(args.detection_of).read_text())["files"]))
        return 0

    from handler.settings import load_settings
    from handler.startup import start_worker
    from speech_assets import models as pypi_models

    try:
        items = build(DEFAULT_DIR, args.per_language)
        model_dir = pypi_models.model_dir(args.model, DEFAULT_DIR.parent / "whisper-base")
    except (FetchError, pypi_models.ModelMissing) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    if args.languages:
        keep = set(args.languages.split(","))
        items = [it for it in items if it.language in keep or not it.language]
    print(describe(items), flush=True)
    machine = describe_machine()
    audio_s = sum(_dur(it.path) for it in items)
    configs: dict[str, dict[str, Any]] = {"worker": {}}
    for c in args.config:
        name, _, js = c.partition("=")
        configs[name] = json.loads(js)
    tty = sys.stderr.isatty()

    def progress(msg: str) -> None:
        if tty:
            print(f"\r{msg}   ", end="", file=sys.stderr, flush=True)

    runs = []
    if not args.no_plain:
        from faster_whisper import WhisperModel

        from handler.inference.threads import configure, usable_cpus

        configure()
        plain = WhisperModel(
            str(model_dir), device="cpu", compute_type="int8", cpu_threads=usable_cpus()
        )
        runs.append(run_plain(plain, items, progress))
        del plain
    worker = start_worker(
        load_settings(
            {"WHISPER_DEVICE": "cpu", "WHISPER_MODEL": str(model_dir), "WHISPER_WARMUP": "false"}
        )
    )
    for name, options in configs.items():
        options = dict(options)
        env = options.pop("$env", None)
        w = worker
        if env:  # deploy-time settings for this config: a worker of its own
            base = {"WHISPER_DEVICE": "cpu", "WHISPER_MODEL": str(model_dir)}
            w = start_worker(load_settings({**base, "WHISPER_WARMUP": "false", **env}))
        runs.append(run_worker(name, w, options, items, progress))
    if tty:
        print(file=sys.stderr)
    print(
        f"\nmodel {args.model}, {len(items)} files, {audio_s / 60:.1f} min; WER (lower is better)"
    )
    print(table(runs, audio_s))
    rows = _rows(runs)
    print("\n" + dropped_speech(runs))
    print("\nlanguage detection (right / judged):")
    print(detection_table(rows))
    if len(runs) > 1:
        print("\nfiles that differ most from the first column:")
        print(worst(runs))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = stamp(
        {
            "model": args.model,
            "configs": configs,
            "table": table(runs, audio_s),
            "detection": detection_table(rows),
            "files": rows,
        },
        machine,
    )
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    return 0


def _dur(path: Path) -> float:
    import wave

    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


if __name__ == "__main__":
    sys.exit(main())
