"""glibc's allocator told to keep the memory it has, so inference stops paying page faults.

CTranslate2 allocates its large per-call buffers (the encoder's activations, the attention
scores of a batch: tens to hundreds of MB) with plain ``malloc`` and frees them after each
call. glibc serves anything over its mmap threshold (32 MiB at most, dynamically) with a
fresh ``mmap`` and gives it back with ``munmap``, and each thread's arena is an ``mmap``'d
heap of its own: so every encoder call faulted its buffers in again, page by page. Measured
on a 2-core Xeon (``python -m bench alloc``, bench/README.md): 34-45 % of the encoder's CPU
time was the kernel's, and 0-2 % with this policy; the encoder took 20-35 % less time.

The policy, applied with ``mallopt`` when the ``handler`` package is first imported (before
numpy, CTranslate2 or the model exist, whichever entry point starts the process): one arena
(``M_ARENA_MAX=1``: per-thread arenas are ``mmap``'d heaps, which is where a batch's buffers
went), no ``mmap`` for large blocks (``M_MMAP_MAX=0``: they come from the one heap and are
reused), and freed memory kept instead of trimmed (``M_TRIM_THRESHOLD``). ``mallopt`` cannot
raise the mmap threshold past 32 MiB (glibc refuses it), which is why a threshold alone did
not help and ``M_MMAP_MAX=0`` is used instead. The cost: the heap stays at the peak working
set of the jobs run so far (bounded by the memory budget, handler.inference.memory), so after a long
job with nothing else running the worker gives the memory back (:func:`release`).

A deployment that set its own allocator (``GLIBC_TUNABLES``, ``MALLOC_*_`` variables, an
``LD_PRELOAD``'d jemalloc or tcmalloc) keeps it, and ``WHISPER_MALLOC=system`` turns this
off. Not glibc (musl, macOS): nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
M_ARENA_MAX = -8

KEEP = {
    M_ARENA_MAX: 1,
    M_MMAP_MAX: 0,
    M_TRIM_THRESHOLD: 2**31 - 1,  # an int for mallopt; ~2 GiB of free top kept
    M_TOP_PAD: 64 << 20,  # grow the heap 64 MiB at a time: fewer brk calls
}
SETTING = "WHISPER_MALLOC"
"""``keep`` (the default) or ``system`` (glibc's own behaviour)."""
DEPLOYMENT_VARS = (
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "LD_PRELOAD",
)

_state: dict[str, str] = {"policy": "unset"}


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # musl exports a mallopt that does nothing; only glibc's is wanted.
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def decide(env: Mapping[str, str]) -> str:
    """``keep``, ``system`` (asked for) or ``deployment`` (the environment chose one)."""
    choice = env.get(SETTING, "keep").strip().lower() or "keep"
    if choice not in ("keep", "system"):
        log.warning("%s=%r is not keep or system; using keep", SETTING, choice)
        choice = "keep"
    if choice == "keep" and any(env.get(v) for v in DEPLOYMENT_VARS):
        return "deployment"
    return choice


def configure(env: Mapping[str, str] | None = None) -> str:
    """Apply the policy once per process; returns the policy in effect."""
    if _state["policy"] != "unset":
        return _state["policy"]
    policy = decide(os.environ if env is None else env)
    if policy == "keep":
        libc = _libc()
        if libc is None:
            policy = "not-glibc"
        elif not all(libc.mallopt(param, value) == 1 for param, value in KEEP.items()):
            policy = "refused"  # mallopt answers 1 on success
    _state["policy"] = policy
    return policy


def policy() -> str:
    """The policy in effect: keep, system, deployment, not-glibc, refused or unset."""
    return _state["policy"]


RELEASE_AFTER_AUDIO_S = 600.0
"""A job at least this long (seconds of audio) gives its memory back when it is the last one
running: its decoded audio alone was 38 MB per 10 minutes, and short jobs reuse what the
heap holds."""


def release() -> bool:
    """Give the heap's free memory back to the system (``malloc_trim``); True if it did."""
    if _state["policy"] != "keep":
        return False
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))
