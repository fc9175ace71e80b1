"""``python -m bench broker-faults``'s procedure, run by the suite with fewer jobs: short
real-speech jobs through a real gateway to two real consumer processes on a real Redis,
one consumer SIGKILLed midway and started again by its supervisor."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.model]


FAULT_JOBS = 50
"""``python -m bench broker-faults`` runs 500 (about 3 minutes here); the suite 50."""


def test_jobs_through_two_consumers_one_killed_midway() -> None:
    """At-least-once delivery, exactly one result: the killed consumer's jobs run again
    on the others after the visibility timeout; none lost, none twice, none stuck, and
    each text as the same model gives in-process."""
    from bench.broker.faults import kill_midway

    fig = kill_midway(FAULT_JOBS)
    assert fig["completed"] == FAULT_JOBS and fig["lost"] == 0, fig
    assert fig["duplicated"] == 0 and fig["stored_completions"] == FAULT_JOBS, fig
    assert fig["stuck_in_progress"] == 0 and fig["other_endings"] == 0, fig
    assert fig["running_when_killed"] >= 1 and fig["ran_again"] >= 1, fig
    assert fig["not_as_in_process"] == 0 and fig["mean_wer"] < 0.15, fig
