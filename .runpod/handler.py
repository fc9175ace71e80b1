"""RunPod Hub entry shim: the Hub looks for a handler.py; the worker itself is ``handler/``.

The image runs ``python -m handler`` (Dockerfile CMD); this file only lets
``python .runpod/handler.py`` do the same from a checkout. It must not shadow the package:
run as a script, Python puts this folder first on ``sys.path``, where ``import handler``
would find this very file, so the folder is swapped for the repository root first.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def use_repository_root() -> None:
    """Make ``import handler`` mean the worker package, not this shim."""
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    shim = sys.modules.get("handler")
    if (
        shim is not None
        and Path(getattr(shim, "__file__", "") or "").resolve() == Path(__file__).resolve()
    ):
        del sys.modules["handler"]


def main() -> None:
    use_repository_root()
    runpy.run_module("handler", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
