"""Serve an emulated RunPod endpoint until Ctrl-C: `python -m runpod_emulator --workers 1`.

Prints the client URL, the API key and the environment a worker started by hand
needs. With --records, writes the timing records as JSON on exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import sys
import threading

from .config import EmulatorConfig
from .core import Emulator


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m runpod_emulator", description=__doc__)
    parser.add_argument("--workers", type=int, default=0, help="worker processes to start")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any)")
    parser.add_argument("--endpoint", default="local-endpoint", help="endpoint id in URLs")
    parser.add_argument("--api-key", default="local-emulator-key")
    parser.add_argument(
        "--command",
        default=None,
        help="worker command line (default: this python -m handler)",
    )
    parser.add_argument("--cwd", default=None, help="working directory of workers")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra worker environment (repeatable)",
    )
    parser.add_argument("--ping-interval-ms", type=int, default=10_000)
    parser.add_argument("--execution-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--take-poll", type=float, default=1.0, help="job-take hold, seconds")
    parser.add_argument("--log-dir", default=None, help="worker logs (default: a temp dir)")
    parser.add_argument("--records", default=None, help="write records JSON here on exit")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    extra = dict(item.split("=", 1) for item in args.env if "=" in item)
    config = EmulatorConfig(
        endpoint_id=args.endpoint,
        api_key=args.api_key,
        port=args.port,
        worker_env=extra,
        worker_cwd=args.cwd,
        ping_interval_ms=args.ping_interval_ms,
        execution_timeout_s=args.execution_timeout,
        take_poll_s=args.take_poll,
        log_dir=args.log_dir,
        initial_workers=args.workers,
    )
    if args.command:
        config.worker_command = shlex.split(args.command)
    done = threading.Event()
    # SIGTERM as well as Ctrl-C, so a supervisor can stop it cleanly too.
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    emulator = Emulator(config).start()
    try:
        print(f"endpoint: {emulator.client_url}  (Authorization: Bearer {emulator.api_key})")
        print("send a job with the client (copy and paste):")
        print(
            f"  RUNPOD_API_KEY={shlex.quote(emulator.api_key)} python -m whisper_client "
            f"tests/data/jfk.wav --endpoint {shlex.quote(emulator.config.endpoint_id)} "
            f"--base-url {shlex.quote(emulator.base_url)}"
        )
        print(f"worker logs: {emulator.log_dir}")
        print("environment for a worker started by hand (pick any RUNPOD_POD_ID):")
        for key, value in emulator.worker_env("my-worker").items():
            print(f"  export {key}={shlex.quote(value)}")
        sys.stdout.flush()
        try:
            done.wait()
        except KeyboardInterrupt:
            pass
    finally:
        print("cancelling running jobs, stopping workers, then the server ...", flush=True)
        emulator.stop(cancel_running=True)
        if args.records:
            with open(args.records, "w") as fh:
                json.dump(emulator.records(), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
