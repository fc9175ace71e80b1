"""CTranslate2's CPU instruction set, as the worker chooses it (handler/inference/cpu_isa.py).

CTranslate2 never picks AVX-512 by itself (it takes it only from CT2_FORCE_CPU_ISA); the
worker sets that variable when the CPU has what CTranslate2 asks for and the deployment
did not set it. The end-to-end tests read the ISA CTranslate2 itself says it selected
(its own log line with CT2_VERBOSE=1) in a fresh process that imports the worker and loads
the real tiny.en model, so they fail if the variable is set too late or not at all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from handler.inference import cpu_isa

# The flags lines of real CPUs (trimmed to the x86 SIMD flags that matter here).
ZEN4_EPYC = (
    "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f avx512dq avx512ifma avx512cd "
    "avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vnni avx512_vpopcntdq"
)
ZEN3_EPYC = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma vaes vpclmulqdq"
KNIGHTS_LANDING = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f avx512pf avx512er avx512cd"
SAPPHIRE_RAPIDS = ZEN4_EPYC + " amx_bf16 amx_tile amx_int8"


def _flags(line: str) -> frozenset[str]:
    return cpu_isa.cpu_flags(f"processor\t: 0\nvendor_id\t: x\nflags\t\t: {line}\n\n")


def test_avx512_is_chosen_only_where_ctranslate2_would_accept_it() -> None:
    assert cpu_isa.decide({}, _flags(ZEN4_EPYC), "x86_64") == "AVX512"
    assert cpu_isa.decide({}, _flags(SAPPHIRE_RAPIDS), "x86_64") == "AVX512"
    # No AVX-512, or only part of it (no VL/DQ/BW): CTranslate2's own choice stays.
    assert cpu_isa.decide({}, _flags(ZEN3_EPYC), "x86_64") == "default"
    assert cpu_isa.decide({}, _flags(KNIGHTS_LANDING), "x86_64") == "default"
    assert cpu_isa.decide({}, frozenset(), "x86_64") == "default"
    assert cpu_isa.decide({}, _flags(ZEN4_EPYC), "aarch64") == "default"


def test_a_deployments_own_isa_wins() -> None:
    for value in ("AVX2", "AVX512", "GENERIC"):
        env = {cpu_isa.VARIABLE: value}
        assert cpu_isa.decide(env, _flags(ZEN4_EPYC), "x86_64") == "deployment"
    # Set but empty is not a choice (CTranslate2 ignores an empty value too).
    assert cpu_isa.decide({cpu_isa.VARIABLE: " "}, _flags(ZEN4_EPYC), "x86_64") == "AVX512"


def test_configure_sets_the_variable_only_when_it_chooses() -> None:
    saved = dict(cpu_isa._state)
    try:
        env: dict[str, str] = {}
        cpu_isa._state["isa"] = "unset"
        got = cpu_isa.configure(env)
        here = cpu_isa.cpu_flags(cpu_isa.CPUINFO.read_text())
        if cpu_isa.AVX512_FLAGS <= here:
            assert got == "AVX512" and env == {cpu_isa.VARIABLE: "AVX512"}
        else:
            assert got == "default" and env == {}
        cpu_isa._state["isa"] = "unset"
        env = {cpu_isa.VARIABLE: "AVX2"}
        assert cpu_isa.configure(env) == "deployment" and env == {cpu_isa.VARIABLE: "AVX2"}
    finally:
        cpu_isa._state.update(saved)


PROBE = r"""
import handler.inference
import ctranslate2
from speech_assets.models import tiny_en_dir
ctranslate2.models.Whisper(str(tiny_en_dir()), device="cpu", compute_type="int8")
"""


def _selected_isa(**extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != cpu_isa.VARIABLE}
    env.update(extra, CT2_VERBOSE="1")
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.findall(r"Selected ISA: (\w+)", proc.stderr)
    assert found, proc.stderr[-2000:]
    return found[-1]


def test_the_worker_makes_ctranslate2_use_avx512_where_the_cpu_has_it() -> None:
    here = cpu_isa.cpu_flags(cpu_isa.CPUINFO.read_text())
    expected = "AVX512" if cpu_isa.AVX512_FLAGS <= here else "AVX2"
    if "avx2" not in here:
        expected = "AVX" if "avx" in here else "GENERIC"
    assert _selected_isa() == expected


def test_a_deployment_that_sets_the_isa_keeps_it() -> None:
    assert _selected_isa(CT2_FORCE_CPU_ISA="GENERIC") == "GENERIC"
