"""The layout's rules, checked on the source tree (pure tier: no model, no emulator).

Four products live side by side, each a package of its own:

- ``handler/``: the worker, the only thing the image ships;
- ``whisper_client/``: the client for callers of a deployed endpoint;
- ``runpod_emulator/``: a local RunPod (queue, workers, billing) for tests and the bench;
- ``bench/``: measurements, the one place that imports all three.

The worker imports none of the others. The client and the emulator import nothing of the
worker but its documented public modules (``handler.contract``, ``handler.schema``).
Inside the worker, only the model modules import faster-whisper and only the entry
modules import the runpod SDK.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCTS = ("handler", "whisper_client", "runpod_emulator", "bench")
PUBLIC_WORKER_MODULES = {"handler.contract", "handler.schema"}
# Where the worker may import faster-whisper and CTranslate2: the inference folder, and
# startup's early import (see startup.prepare), which imports handler.inference first.
ENGINE_OK_FOLDERS = ("handler/inference/",)
ENGINE_OK_FILES = {"handler/startup.py"}
# The runpod SDK: the queue entry, the RunPod handlers and their result posts.
RUNPOD_OK = {
    "handler/__main__.py",
    "handler/faces/runpod_handlers.py",
    "handler/faces/result_posts.py",
}
ROOMS = ("faces", "pipeline", "audio", "inference", "output")
TOP = {"handler/__main__.py", "handler/cli.py", "handler/startup.py", "handler/serve.py"}
"""The entry points: the only modules that may import a face."""
GROUND = {
    "handler/settings.py",
    "handler/schema.py",
    "handler/errors.py",
    "handler/guard.py",
    "handler/contract.py",
}


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            found.update(a.value for a in node.args if isinstance(a, ast.Constant))
    return found


def files_of(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def top(module: str) -> str:
    return module.split(".")[0]


def test_imports_of_resolves_relative_and_function_level_imports() -> None:
    # A negative control for the checker itself: it must see what the rules forbid.
    pkg = ROOT / "runpod_emulator" / "core.py"
    assert "runpod_emulator.config" in imports_of(pkg)
    assert "handler.pipeline.job" in imports_of(ROOT / "handler" / "cli.py")


def test_the_worker_imports_no_other_product() -> None:
    bad = {
        f"{p.relative_to(ROOT)}: {m}"
        for p in files_of("handler")
        for m in imports_of(p)
        if top(m)
        in {
            "whisper_client",
            "runpod_emulator",
            "bench",
            "tests",
            "builder",
            "speech_assets",
        }
    }
    assert not bad, sorted(bad)


def test_tests_of_the_worker_need_no_bench_and_assets_need_neither() -> None:
    """Tests of the bench itself live in tests/bench/; every other test needs no bench."""
    bad = [
        f"{p.name}: {m}"
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if "bench" not in p.relative_to(ROOT / "tests").parts[:-1]
        for m in imports_of(p)
        if top(m) == "bench"
    ]
    assert not bad, bad
    for p in files_of("speech_assets"):
        assert not {top(m) for m in imports_of(p)} & {"bench", "tests", "handler"}, p


@pytest.mark.parametrize("package", ["whisper_client", "runpod_emulator"])
def test_client_and_emulator_use_only_the_public_worker_modules(package: str) -> None:
    others = {"whisper_client", "runpod_emulator", "bench", "tests"} - {package}
    bad = set()
    for p in files_of(package):
        for m in imports_of(p):
            if top(m) in others:
                bad.add(f"{p.relative_to(ROOT)}: {m}")
            if top(m) == "handler" and not any(
                m == pub or m.startswith(pub + ".") for pub in PUBLIC_WORKER_MODULES
            ):
                bad.add(f"{p.relative_to(ROOT)}: {m}")
    assert not bad, sorted(bad)


def test_public_worker_modules_import_nothing_heavy() -> None:
    heavy = {"faster_whisper", "ctranslate2", "av", "numpy", "runpod", "boto3", "requests"}
    for module in PUBLIC_WORKER_MODULES:
        path = ROOT / (module.replace(".", "/") + ".py")
        bad = {m for m in imports_of(path) if top(m) in heavy}
        bad |= {
            m
            for m in imports_of(path)
            if top(m) == "handler"
            and m.count(".")
            and not any(
                m.startswith(pub)
                for pub in PUBLIC_WORKER_MODULES | {"handler.errors", "handler.output.cues"}
            )
        }
        assert not bad, (module, bad)


def test_only_inference_imports_faster_whisper_and_only_the_entry_imports_runpod():
    for p in files_of("handler"):
        rel = str(p.relative_to(ROOT))
        mods = {top(m) for m in imports_of(p)}
        if "faster_whisper" in mods or "ctranslate2" in mods:
            assert rel.startswith(ENGINE_OK_FOLDERS) or rel in ENGINE_OK_FILES, rel
        if "runpod" in mods:
            assert rel in RUNPOD_OK, rel


def room_of(module: str) -> str | None:
    """``faces``, ``audio``, ``inference`` or ``output`` for a handler module, else None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "handler" and parts[1] in ROOMS else None


def worker_imports() -> dict[str, set[str]]:
    return {
        str(p.relative_to(ROOT)): {m for m in imports_of(p) if top(m) == "handler"}
        for p in files_of("handler")
    }


def test_the_rooms_import_rules() -> None:
    """The folder rules: audio and inference never import each other; output
    imports no inference; nothing below the entry points imports a face; the ground
    imports no room (but the subtitle layout the schema validates)."""
    bad = []
    for rel, mods in worker_imports().items():
        here = rel.split("/")[1] if rel.count("/") > 1 else None
        rooms = {room_of(m) for m in mods} - {None, here}
        if here == "audio" and "inference" in rooms:
            bad.append(f"{rel}: audio imports inference")
        if here == "inference" and "audio" in rooms:
            bad.append(f"{rel}: inference imports audio")
        if here == "output" and "inference" in rooms:
            bad.append(f"{rel}: output imports inference")
        if here in ("audio", "inference", "output") and "pipeline" in rooms:
            bad.append(f"{rel}: {here} imports the pipeline")
        if "faces" in rooms and rel not in TOP:
            bad.append(f"{rel}: imports a face")
        if rel in GROUND and rooms - ({"output"} if rel == "handler/schema.py" else set()):
            bad.append(f"{rel}: the ground imports {sorted(r for r in rooms if r)}")
        if rel == "handler/schema.py" and any(
            room_of(m) == "output" and not m.startswith("handler.output.cues") for m in mods
        ):
            bad.append(f"{rel}: imports output beyond the subtitle layout")
    assert not bad, bad


def test_the_rules_checker_sees_a_violation() -> None:
    # Negative control: the pipeline importing a face (the passthrough's old import).
    assert room_of("handler.faces.openai_api") == "faces"
    assert room_of("handler.pipeline.job") == "pipeline"
    assert room_of("handler.contract") is None
    assert room_of("handler.inference") is None  # the package itself: its policies


def test_importing_the_public_modules_changes_nothing_in_the_callers_process() -> None:
    """whisper_client imports handler.contract: that must not set OMP_WAIT_POLICY or the
    allocator policy in the caller's process."""
    code = (
        "import os, sys, json; import handler.contract, handler.schema; "
        "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), "
        "'handler.inference' in sys.modules, 'numpy' in sys.modules]))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [None, False, False]


BLOCKER = r"""
import importlib.abc, json, sys
BLOCKED = set(json.loads(sys.argv[1]))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not in the worker image")
sys.meta_path.insert(0, Block())
sys.argv = ["whisper-worker", *sys.argv[2:]]
from handler.cli import main
sys.exit(main())
"""


def _in_image(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run ``whisper-worker ARGV`` with what the image lacks made unimportable: the other
    products and every package of the dev/bench extras (the image installs only the
    project's own dependencies; its model is baked, here it is the PyPI tiny.en)."""
    blocked = [
        "whisper_client",
        "runpod_emulator",
        "bench",
        "tests",
        "builder",
        "speech_assets",
        "pytest",
        "moto",
        "srt",
        "webvtt",
        "matplotlib",
        "openai",
        "hypothesis",
        "jiwer",
        "litellm",
    ]
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, json.dumps(blocked), *argv],
        cwd=ROOT / "tests",  # not the repo root: its folders must not shadow the block
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "WHISPER_WARMUP": "false"},
    )


def subcommands() -> list[str]:
    from handler.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


@pytest.mark.parametrize("command", subcommands())
def test_every_cli_subcommand_helps_inside_the_image_package_set(command: str) -> None:
    proc = _in_image(command, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: whisper-worker" in proc.stdout


@pytest.mark.model
def test_cli_job_runs_a_real_job_inside_the_image_package_set() -> None:
    job = json.loads((ROOT / "test_input.json").read_text())
    proc = _in_image("job", "-", stdin=json.dumps(job))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ask not what your country" in json.loads(proc.stdout)["text"]


def test_no_function_in_the_worker_is_over_60_lines() -> None:
    """The pipeline reads as its table of contents; ruff's C901 (at 15) checks
    the branching, this the length."""
    long = []
    for p in files_of("handler"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 60:
                    long.append(f"{p.relative_to(ROOT)}:{node.name} ({n} lines)")
    assert not long, long


def module_graph() -> dict[str, set[str]]:
    """Every module of the products and the modules it imports, at any depth
    (``TYPE_CHECKING`` and function-level imports too: a circle there is still a knot).
    ``from package import name`` counts as importing the module ``package.name`` where one
    exists, else the package."""
    modules: dict[str, Path] = {}
    for product in (*PRODUCTS, "builder", "speech_assets"):
        for p in files_of(product):
            parts = p.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {}
    for name, p in modules.items():
        tree = ast.parse(p.read_text(), filename=str(p))
        package = name if p.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    edges.add(full if full in modules else base)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere() -> None:
    assert circles(module_graph()) == []


def test_the_circle_finder_sees_a_circle() -> None:
    # Negative control: the knot the pipeline once had (job <-> diarization).
    graph = {"a.job": {"a.diarization"}, "a.diarization": {"a.job"}, "a.x": {"a.job"}}
    assert circles(graph) == [["a.diarization", "a.job"]]


def test_no_worker_module_is_over_520_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in files_of("handler")
        if (n := len(p.read_text().splitlines())) > 520
    }
    assert not long, long


def test_each_shared_fact_is_defined_once() -> None:
    """The sample rate and the terminal job states live in handler/contract.py alone."""
    bad = []
    for product in PRODUCTS:
        for p in files_of(product):
            if p == ROOT / "handler" / "contract.py":
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
                    node.value, ast.Constant
                ):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names = {t.id for t in targets if isinstance(t, ast.Name)}
                    if "SAMPLE_RATE" in names:
                        bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: SAMPLE_RATE")
                if isinstance(node, ast.Set) and {
                    e.value for e in node.elts if isinstance(e, ast.Constant)
                } >= {"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"}:
                    bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: the terminal states")
    assert not bad, bad


def test_no_private_name_crosses_a_module_boundary() -> None:
    """A name starting with _ is its module's own: no other module of the bench, the tests
    or the products imports it."""
    bad = []
    for product in (*PRODUCTS, "tests"):
        for p in files_of(product):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ImportFrom) and top(node.module or "") in PRODUCTS:
                    bad += [
                        f"{p.relative_to(ROOT)}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_")
                    ]
    assert not bad, bad
