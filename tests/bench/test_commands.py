"""``python -m bench``: one table of subcommands from which the parser, --help and the
dispatch are built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_bench_module_with_a_main_is_a_subcommand_in_help() -> None:
    from bench.__main__ import COMMANDS

    modules = {c.module for c in COMMANDS if c.module}
    runnable = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in sorted((ROOT / "bench").rglob("*.py"))
        if p.parent != ROOT / "bench" and "def main(" in p.read_text()
    }
    assert runnable == modules, runnable ^ modules
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for command in COMMANDS:
        assert f"    {command.name} " in proc.stdout or f"    {command.name}\n" in proc.stdout


def test_a_subcommand_runs_its_module_from_the_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "memory", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: python -m bench memory")
