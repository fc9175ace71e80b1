"""The allocator policy in effect (pure tier: no model): read from what the kernel counts.

Glibc gave every large CTranslate2 buffer back with munmap and faulted it in
again on the next call, a third of the CPU in the kernel. The policy is applied when the
``handler`` package is first imported (handler/inference/allocator.py); these tests read its effect
in a fresh process the way it matters: the page faults of a large block allocated, touched
and freed twice. Without the policy (the negative control, WHISPER_MALLOC=system) the
second round faults every page in again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from handler.inference import allocator

PROBE = r"""
import ctypes, json, resource, sys
import handler
from handler.inference import allocator

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 64 * 2**20  # over glibc's largest mmap threshold, as a batch's buffers are

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

counts = []
for _ in range(3):
    before = faults()
    block = libc.malloc(SIZE)  # as CTranslate2 allocates its buffers
    ctypes.memset(block, 1, SIZE)
    libc.free(block)
    counts.append(faults() - before)
print(json.dumps({"policy": allocator.policy(), "faults": counts}))
"""
PAGES = 64 * 2**20 // 4096


def _probe(**env_extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in allocator.DEPLOYMENT_VARS and k != allocator.SETTING
    }
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(allocator._libc() is None, reason="glibc only")
def test_importing_the_worker_keeps_large_blocks_in_the_heap() -> None:
    out = _probe()
    assert out["policy"] == "keep"
    # The first round grows the heap; later rounds reuse it without a fault per page.
    assert max(out["faults"][1:]) < PAGES // 10, out


@pytest.mark.skipif(allocator._libc() is None, reason="glibc only")
def test_without_the_policy_every_round_faults_again() -> None:
    out = _probe(WHISPER_MALLOC="system")
    assert out["policy"] == "system"
    assert min(out["faults"][1:]) > PAGES // 2, out


def test_a_deployments_own_allocator_settings_win() -> None:
    out = _probe(GLIBC_TUNABLES="glibc.malloc.arena_max=2")
    assert out["policy"] == "deployment"
    assert allocator.decide({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "deployment"
    assert allocator.decide({}) == "keep"
    assert allocator.decide({"WHISPER_MALLOC": "SYSTEM"}) == "system"
    assert allocator.decide({"WHISPER_MALLOC": "bogus"}) == "keep"
