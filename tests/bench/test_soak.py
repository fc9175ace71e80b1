"""The short fault soak: a few dozen jobs through real workers under the real
SDK loop and the emulator, every bad-input class, job-done 5xx before and after commit,
a worker SIGKILLed and one SIGTERMed mid-run and replaced. Nothing lost by a live worker,
nothing wrong or duplicated, no temp file or fd left. ``python -m bench soak`` is the
1000-job version."""

from __future__ import annotations

import pytest

from bench.soak.soak import render, run

pytestmark = [pytest.mark.e2e, pytest.mark.model]


def test_short_soak_loses_nothing() -> None:
    result = run(jobs=40, workers=2, seed=1, fault_every=10, kill_every=20, job_timeout_s=300)
    assert result["submitted"] == 40
    assert result["lost_by_live_worker"] == 0, render(result)
    assert result["wrong"] == [] and result["duplicated"] == 0, render(result)
    assert result["leaks"] == [], render(result)
    assert result["exactly_one_outcome"] + result["lost"] + result["duplicated"] == 40
    assert any("SIGKILL" in e for e in result["events"])
    assert any("SIGTERM" in e for e in result["events"])
    assert result["late_reposts"] >= 1  # the after-commit failures were re-posted
    assert len(result["cases"]) >= 10  # a real mix, not one case
