"""``whisper-worker``: the command line for people.

- ``transcribe FILE``: print text, JSON, SRT or VTT for a local audio file;
- ``job FILE|-``: run a job JSON exactly as the platform delivers it (``{"input": {...}}``)
  and print the output object; exit 0 on success, 1 on a job error;

The client (``python -m whisper_client``), the platform emulator (``python -m
runpod_emulator``) and the benchmark (``python -m bench``) are products of their own and
are not in the worker's image, so this command does not offer them.

transcribe and job run in-process through the same ``run_job`` as the worker.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

from handler.pipeline.runtime import Runtime
from handler.startup import STARTUP_ERRORS, Loader


def _load(args: argparse.Namespace) -> Runtime:
    try:
        return Loader(log_level="DEBUG" if args.verbose else "WARNING").wait()
    except STARTUP_ERRORS as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        sys.exit(1)


def _run(worker: Runtime, job_input: Any, **callbacks: Any) -> dict:
    from handler.pipeline.job import run_job

    return run_job(job_input, worker, job_id="cli", **callbacks)


class _Progress:
    """A progress bar on a terminal (audio done of total, rate, ETA); silent when piped."""

    def __init__(self, enabled: bool) -> None:
        self.bar: Any = None
        self.enabled = enabled

    def __call__(self, percent: float) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            fmt = "{l_bar}{bar}| {n:.0f}/{total:.0f}% of the audio [{elapsed}<{remaining}]"
            self.bar = tqdm(total=100.0, file=sys.stderr, leave=False, bar_format=fmt)
        self.bar.update(percent - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _flags_to_job(args: argparse.Namespace, job: dict[str, Any]) -> None:
    """The command line's switches as job fields."""
    if args.word_timestamps:
        job["word_timestamps"] = True
        if args.format == "json":
            job["output"].append("words")
    if args.no_vad:
        job["vad_filter"] = False
    if args.diarize or args.num_speakers is not None:
        job["diarize"] = True
        if args.num_speakers is not None:
            job["num_speakers"] = args.num_speakers
    if args.multichannel:
        job["multichannel"] = True
    if args.profanity_filter:
        job["profanity_filter"] = True
    if args.redact:
        job["redact"] = [k.strip() for k in args.redact.split(",")]


def cmd_transcribe(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        print(f"whisper-worker: no such file: {path}", file=sys.stderr)
        return 2
    data = path.read_bytes()
    worker = _load(args)
    # The inline cap protects the platform's request size; a local file is the user's own.
    # Progress every half second on a terminal (the worker's default is minutes apart).
    worker.settings = worker.settings.model_copy(
        update={
            "max_inline_bytes": max(worker.settings.max_inline_bytes, len(data)),
            "progress_interval_s": 0.5,
        }
    )
    fmt = args.format
    outputs = {"text": ["text", "segments"], "json": ["text", "segments"]}.get(fmt, [fmt])
    job: dict[str, Any] = {"audio_base64": base64.b64encode(data).decode(), "output": outputs}
    for name in ("language", "task", "beam_size", "batch_size", "model", "initial_prompt"):
        value = getattr(args, name)
        if value is not None:
            job[name] = value
    _flags_to_job(args, job)
    progress = _Progress(sys.stderr.isatty() and not args.stream)

    def stream(seg: Any) -> None:
        side = f" channel {seg['channel']}" if "channel" in seg else ""
        print(f"[{seg['start']:7.2f} -> {seg['end']:7.2f}{side}] {seg['text'].strip()}", flush=True)

    try:
        result = _run(worker, job, on_progress=progress, on_segment=stream if args.stream else None)
    finally:
        progress.close()
    if "error" in result:
        print(f"whisper-worker: {result['error_code']}: {result['error']}", file=sys.stderr)
        return 1
    for warning in result.get("warnings", []):
        print(f"whisper-worker: warning: {warning}", file=sys.stderr)
    if args.stream:
        return 0
    if fmt == "json":
        print(json.dumps(result, indent=2, ensure_ascii=False))
    elif fmt == "text":
        # One line per segment: a long recording is readable, not one 4000-character line.
        for seg in result["segments"]:
            who = seg.get("speaker") or (
                "channel {}".format(seg["channel"]) if "channel" in seg else ""
            )
            print((f"{who}: " if who else "") + seg["text"].strip())
    else:
        out = result[fmt]
        print(out, end="" if out.endswith("\n") else "\n")
    return 0


def _read_job_file(name: str) -> str | None:
    try:
        if name == "-":
            return sys.stdin.read()
        return Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        print(f"whisper-worker: no such file: {name}", file=sys.stderr)
    except IsADirectoryError:
        print(f"whisper-worker: {name} is a folder, not a job file", file=sys.stderr)
    except UnicodeDecodeError:
        print(
            f"whisper-worker: {name} is not a JSON text file (for audio use: whisper-worker "
            "transcribe FILE)",
            file=sys.stderr,
        )
    except OSError as exc:
        print(f"whisper-worker: cannot read {name}: {exc.strerror}", file=sys.stderr)
    return None


def cmd_job(args: argparse.Namespace) -> int:
    raw = _read_job_file(args.file)
    if raw is None:
        return 2
    try:
        job = json.loads(raw)
    except RecursionError:
        print("whisper-worker: the job file is nested too deeply", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"whisper-worker: the job file is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(job, dict) or "input" not in job:
        print('whisper-worker: a job is {"input": {...}}', file=sys.stderr)
        return 2
    worker = _load(args)
    result = _run(worker, job["input"])
    print(json.dumps(result, ensure_ascii=False))
    return 1 if "error" in result else 0


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from handler.serve import serve

    if args.port is not None:
        os.environ["PORT"] = str(args.port)
    return serve()


def cmd_consume(_args: argparse.Namespace) -> int:
    from handler.faces.broker.consumer import broker_settings, supervise

    settings = broker_settings(no_broker=2)  # a usage error, as the other commands'
    return settings if isinstance(settings, int) else supervise(settings)


def _transcribe_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    t = sub.add_parser(
        "transcribe",
        parents=[common],
        help="transcribe a local audio file",
        description="Transcribe a local audio file in-process, through the worker's own job "
        "pipeline, and print text (one line per segment), JSON, SRT or WebVTT.",
    )
    t.add_argument("file", help="audio or video file (wav, mp3, flac, m4a, ogg, webm, ...)")
    t.add_argument(
        "-f",
        "--format",
        choices=["text", "json", "srt", "vtt"],
        default="text",
        help="what to print (default: text)",
    )
    t.add_argument("--model", help="a model the worker loaded (default: WHISPER_MODEL's)")
    t.add_argument("--language", help="language code such as en or de (default: detected)")
    t.add_argument(
        "--task",
        choices=["transcribe", "translate"],
        help="translate: into English (multilingual models only)",
    )
    t.add_argument("--beam-size", type=int, help="beam search width, 1-20 (default 5)")
    t.add_argument(
        "--batch-size", type=int, help="above 1: batched decoding of VAD windows (faster on a GPU)"
    )
    t.add_argument("--initial-prompt", help="text that primes spelling and style")
    t.add_argument("--word-timestamps", action="store_true", help="compute per-word times")
    t.add_argument("--no-vad", action="store_true", help="keep the audio the VAD would cut")
    t.add_argument(
        "--diarize",
        action="store_true",
        help="label who spoke when (needs WHISPER_DIARIZATION=true and the "
        "diarizer's model: docs/deploy.md)",
    )
    t.add_argument(
        "--num-speakers", type=int, help="the number of speakers, when known (implies --diarize)"
    )
    t.add_argument(
        "--multichannel",
        action="store_true",
        help="transcribe each channel on its own (a call's two sides), each line with its channel",
    )
    t.add_argument(
        "--profanity-filter",
        action="store_true",
        help='mask profane words as their first letter and asterisks ("s***")',
    )
    t.add_argument(
        "--redact",
        metavar="KINDS",
        help="mask numbers (runs of three numerals or more): numbers, pci or ssn, comma-separated",
    )
    t.add_argument(
        "--stream", action="store_true", help="print each segment as it is decoded, with its times"
    )
    t.set_defaults(func=cmd_transcribe)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whisper-worker", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    # -v after the subcommand too; SUPPRESS keeps a -v given before it from being reset.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at DEBUG"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    _transcribe_parser(sub, common)

    s = sub.add_parser(
        "serve",
        parents=[common],
        help="serve OpenAI's /v1/audio/transcriptions over HTTP (see the README's HTTP mode)",
        description="Serve the OpenAI-compatible HTTP API on $PORT (default 80), health on "
        "$PORT_HEALTH at $HEALTH_CHECK_PATH (default /ping): 204 while loading, 200 ready.",
    )
    s.add_argument("--port", type=int, help="listen on this port (default: $PORT, else 80)")
    s.set_defaults(func=cmd_serve)

    c = sub.add_parser(
        "consume",
        parents=[common],
        help="take jobs from the broker at $WHISPER_BROKER_URL (docs/broker.md)",
        description="Load the model once, then take jobs from the Celery queue on "
        "$WHISPER_BROKER_URL (Redis) several at a time; SIGTERM finishes the jobs in hand.",
    )
    c.set_defaults(func=cmd_consume)

    j = sub.add_parser(
        "job",
        parents=[common],
        help="run a job JSON ({'input': {...}}) from a file or '-'",
        description="Run a job exactly as the platform delivers it and print the output JSON; "
        "exit 0 on success, 1 on a job error, 2 on a bad command line or job file.",
    )
    j.add_argument("file", help="job JSON file, or - for stdin")
    j.set_defaults(func=cmd_job)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `whisper-worker job x | head`: the reader left, not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
