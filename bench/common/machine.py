"""The machine a measurement ran on, printed beside every table and saved in its JSON.

A ratio is only reproducible on a machine like the one it came from (3.17x on one
2-core machine was 1.34x on another), so each bench says what it ran on: CPU model, the ISA
flags CTranslate2 dispatches on, usable cores, memory, the load before and after, and the
allocator and OpenMP policies the worker applies.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def _cpuinfo() -> tuple[str, list[str]]:
    model: str = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            have = set(value.split())
            flags = [f for f in ISA_FLAGS if f in have]
            break
    return model, flags


def ct2_isa(flags: list[str]) -> str:
    """The instruction set CTranslate2 dispatches its own kernels to: the deployment's
    CT2_FORCE_CPU_ISA, else AVX2 where the CPU has it (CTranslate2 never picks AVX-512
    by itself; bench/README.md, "CTranslate2's ISA and MKL switches")."""
    forced = os.environ.get("CT2_FORCE_CPU_ISA", "").strip()
    return forced or ("AVX2" if "avx2" in flags else "CTranslate2's default")


def describe() -> dict[str, Any]:
    """CPU model, ISA flags, usable cores, memory (GiB) and the 1-minute load now."""
    model, flags = _cpuinfo()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = 0.0
    return {
        "cpu": model,
        "isa": flags,
        "ct2_isa": ct2_isa(flags),
        "cores": cores,
        "memory_gib": round(mem, 1),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def line(info: dict[str, Any], load_after: float | None = None) -> str:
    """One line for a table's caption."""
    after = f", after {load_after:.2f}" if load_after is not None else ""
    return (
        f"machine: {info['cpu']} ({', '.join(info['isa']) or 'no AVX2'}), {info['cores']} cores,"
        f" {info['memory_gib']} GiB; CTranslate2 ISA {info.get('ct2_isa', '?')};"
        f" load {info['load_1m']:.2f} before{after}"
    )


def stamp(report: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``machine`` (as ``before`` read it, plus the load now) added, and
    the machine's line printed: what every bench's JSON and table carry."""
    after = describe()["load_1m"]
    report["machine"] = {**before, "load_1m_after": after}
    print(line(before, after))
    return report
