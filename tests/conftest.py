"""Shared fixtures: the real tiny.en and base models from PyPI, test audio, settings."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from tests.helpers import make_settings

# Generated-input tests draw the same examples on every run by default, so CI's verdict
# is the code's and not the draw's; HYPOTHESIS_PROFILE=explore draws new ones (that is how
# the subnormal temperature step was found: tests/test_hardening.py). Run it now and then.
hypothesis_settings.register_profile("ci", derandomize=True)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session", autouse=True)
def own_temporary_folder(tmp_path_factory):
    """Every temporary file of the run, the servers' and workers' logs and job folders
    included, under pytest's own base folder (it keeps the last three runs), not the shared
    /tmp: a run left hundreds of logs there, and a stale job folder one run left was swept,
    with a log line of its own, by a later server."""
    folder = tmp_path_factory.mktemp("tmp")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    yield folder
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture(scope="session")
def tiny_pool():
    from handler.startup import start_worker

    return start_worker(make_settings(device="cpu")).pool


@pytest.fixture
def worker(tiny_pool):
    """A Runtime on the shared tiny.en pool with default settings (fresh counters per test)."""
    from handler.pipeline.runtime import Runtime

    return Runtime(settings=make_settings(device="cpu", allow_private_urls="true"), pool=tiny_pool)


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory) -> Path:
    """The multilingual base model, assembled from its two PyPI parts and hash-checked."""
    from speech_assets.models import ModelMissing, base_dir

    try:
        return base_dir(tmp_path_factory.mktemp("whisper-base"))
    except ModelMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def no_leaks(tmp_path, monkeypatch):
    """Point tempfile at an empty folder and assert the job left nothing in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    left = list(folder.iterdir())
    assert left == [], f"temporary files left behind: {left}"
