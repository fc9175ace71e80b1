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

from handler.job import Worker
from handler.startup import STARTUP_ERRORS, configure_logging, start_worker


def _load(args: argparse.Namespace) -> Worker:
    configure_logging("DEBUG" if args.verbose else "WARNING")
    try:
        return start_worker()
    except STARTUP_ERRORS as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        sys.exit(1)


def _run(worker, job_input: Any) -> dict:
    from handler.job import run_job

    return run_job(job_input, worker, job_id="cli")


def cmd_transcribe(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        print(f"whisper-worker: no such file: {path}", file=sys.stderr)
        return 2
    data = path.read_bytes()
    worker = _load(args)
    # The inline cap protects the platform's request size; a local file is the user's own.
    worker.settings = worker.settings.model_copy(
        update={"max_inline_bytes": max(worker.settings.max_inline_bytes, len(data))}
    )
    fmt = args.format
    job: dict[str, Any] = {
        "audio_base64": base64.b64encode(data).decode(),
        "output": ["text"] if fmt == "text" else ["text", "segments"] if fmt == "json" else [fmt],
    }
    for name in ("language", "task", "beam_size", "batch_size", "model", "initial_prompt"):
        value = getattr(args, name)
        if value is not None:
            job[name] = value
    if args.word_timestamps:
        job["word_timestamps"] = True
        if fmt == "json":
            job["output"].append("words")
    if args.no_vad:
        job["vad_filter"] = False
    result = _run(worker, job)
    if "error" in result:
        print(f"whisper-worker: {result['error_code']}: {result['error']}", file=sys.stderr)
        return 1
    if fmt == "json":
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        out = result[fmt]
        print(out, end="" if out.endswith("\n") else "\n")
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    try:
        job = json.loads(raw)
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

    from handler.http_server import serve

    if args.port is not None:
        os.environ["PORT"] = str(args.port)
    return serve()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whisper-worker", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("transcribe", help="transcribe a local audio file")
    t.add_argument("file")
    t.add_argument("-f", "--format", choices=["text", "json", "srt", "vtt"], default="text")
    t.add_argument("--model")
    t.add_argument("--language")
    t.add_argument("--task", choices=["transcribe", "translate"])
    t.add_argument("--beam-size", type=int)
    t.add_argument("--batch-size", type=int)
    t.add_argument("--initial-prompt")
    t.add_argument("--word-timestamps", action="store_true")
    t.add_argument("--no-vad", action="store_true")
    t.set_defaults(func=cmd_transcribe)

    s = sub.add_parser(
        "serve",
        help="serve OpenAI's /v1/audio/transcriptions over HTTP (see the README's HTTP mode)",
        description="Serve the OpenAI-compatible HTTP API on $PORT (default 80), health on "
        "$PORT_HEALTH at $HEALTH_CHECK_PATH (default /ping): 204 while loading, 200 ready.",
    )
    s.add_argument("--port", type=int, help="listen on this port (default: $PORT, else 80)")
    s.set_defaults(func=cmd_serve)

    j = sub.add_parser("job", help="run a job JSON ({'input': {...}}) from a file or '-'")
    j.add_argument("file")
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
