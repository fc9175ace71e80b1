"""CTranslate2's CPU instruction set: AVX-512 where the CPU has it.

CTranslate2 dispatches its own CPU kernels (softmax, layer norm, activations, the
element-wise ops around the GEMMs) by instruction set, and it never picks AVX-512 by
itself: ``src/cpu/cpu_isa.cc`` returns AVX2 on any CPU that has it and takes AVX-512 only
from ``CT2_FORCE_CPU_ISA=AVX512`` ("AVX512 can only be enabled with the environment
variable at this time"). The GEMMs themselves run in MKL on Intel and oneDNN elsewhere,
which choose their own kernels, so the gain is in what lies around them. Measured
(bench/README.md, "CTranslate2's ISA and MKL switches"): on the 2-core Xeon of bench/, the
encoder 7-12 % faster per window with tiny.en and base, the decoder level, in both orders;
issue 23's AMD EPYC (Zen 4) went from 0.586 to 0.509 s per tiny.en clip.

So when the CPU has the five AVX-512 subsets CTranslate2 checks (F, CD, VL, DQ, BW) and
the deployment did not set ``CT2_FORCE_CPU_ISA`` itself, the worker sets it to AVX512 when
``handler.inference`` is first imported, before CTranslate2 reads it (once, at the first
model load). A deployment's own value wins (``CT2_FORCE_CPU_ISA=AVX2`` restores
CTranslate2's choice). Only x86-64 Linux is read; elsewhere nothing is done.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger(__name__)

VARIABLE = "CT2_FORCE_CPU_ISA"
AVX512_FLAGS = frozenset({"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"})
"""What CTranslate2's ``cpu_supports_avx512`` asks of the CPU (src/cpu/cpu_info.cc)."""
CPUINFO = Path("/proc/cpuinfo")

_state: dict[str, str] = {"isa": "unset"}


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's flags in /proc/cpuinfo's text (every core has the same)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def decide(env: MutableMapping[str, str], flags: frozenset[str], machine: str) -> str:
    """``deployment`` (the environment chose), ``AVX512`` (to set) or ``default``."""
    if env.get(VARIABLE, "").strip():
        return "deployment"
    if machine.lower() in ("x86_64", "amd64") and AVX512_FLAGS <= flags:
        return "AVX512"
    return "default"


def configure(env: MutableMapping[str, str] | None = None) -> str:
    """Choose once per process (call before CTranslate2's first model); returns the choice."""
    if _state["isa"] != "unset":
        return _state["isa"]
    env = os.environ if env is None else env
    try:
        flags = cpu_flags(CPUINFO.read_text(errors="replace"))
    except OSError:
        flags = frozenset()
    choice = decide(env, flags, platform.machine())
    if choice == "AVX512":
        env[VARIABLE] = "AVX512"
    _state["isa"] = choice
    log.debug("CTranslate2 CPU ISA: %s (%s=%s)", choice, VARIABLE, env.get(VARIABLE))
    return choice


def choice() -> str:
    """What :func:`configure` did: AVX512, deployment, default or unset."""
    return _state["isa"]
