"""CPU threads for inference: as many as the cores this process may use, waiting passively.

CTranslate2 runs its CPU kernels on an OpenMP thread team per calling thread. OpenMP's
default wait policy spins idle team threads for a while after each parallel region, so a
worker with several teams (the loader thread's warm-up, one per job thread, onnxruntime's
VAD) burns the very cores the decoder needs; on a shared 2-core machine that made
``python -m handler`` 3-4x slower than the same transcription in a fresh process. The
policy is read once, when the OpenMP runtime starts (the first ``import ctranslate2``), so
:func:`configure` must run before that: ``handler/inference/__init__.py`` calls it when
that package is first imported, before any module that imports CTranslate2
(``startup.prepare`` calling it was too late: the policy never took effect;
tests/test_entry.py checks what libgomp read).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger(__name__)

PASSIVE_ENV = {
    # Idle OpenMP threads sleep at once instead of spinning. CTranslate2's wheels bundle GNU
    # libgomp, which reads this when it starts; Intel's runtime honours it too.
    "OMP_WAIT_POLICY": "PASSIVE",
}


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by a cgroup v2 quota (``cpu.max``), or None when there is no quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1.0, int(quota) / int(period))
    except (ValueError, ZeroDivisionError):
        return None


def usable_cpus() -> int:
    """Cores this process may run on: its affinity mask, capped by a cgroup quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, int(limit))
    return max(1, n)


def default_cpu_threads(slots: int) -> int:
    """Intra-op threads per model slot so that all slots together fill the usable cores."""
    return max(1, usable_cpus() // max(1, slots))


def configure(env: MutableMapping[str, str] | None = None) -> None:
    """Set the OpenMP wait policy unless the deployment chose one (call before CTranslate2)."""
    env = os.environ if env is None else env
    for key, value in PASSIVE_ENV.items():
        env.setdefault(key, value)
    log.debug("OpenMP: %s", {k: env.get(k) for k in PASSIVE_ENV})
