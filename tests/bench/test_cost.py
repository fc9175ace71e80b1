"""Worked examples for bench/cost/cost.py: per-worker rounding, the cold/working/idle split,
rates, cost per audio hour, active-worker cost and the break-even load.

The rates below are PLACEHOLDERS (currency "XXX", the ISO code for "no currency"), chosen
so the arithmetic is easy to follow by hand. They are not anyone's real prices.
"""

from __future__ import annotations

import json

import pytest

from bench.cost.cost import (
    Rates as _Rates,
)
from bench.cost.cost import (
    Record,
    Worker,
    active_cost_per_audio_hour,
    billed_seconds,
    break_even,
    flex_cost_per_audio_hour,
    peak_concurrent_workers,
    summarize,
    time_split,
    union_length,
)

PLACEHOLDER = _Rates(flex_per_s=0.01, active_per_s=0.006, currency="XXX")

# Epoch-sized times make float noise realistic (spacing ~2.4e-7 s near 1.7e9).
T0 = 1_700_000_000.0


def job(
    id: str,
    taken: float,
    finished: float,
    *,
    audio: float = 10.0,
    ok: bool = True,
    submitted: float | None = None,
) -> dict:
    return {
        "id": id,
        "submitted_at": taken if submitted is None else submitted,
        "taken_at": taken,
        "finished_at": finished,
        "audio_seconds": audio,
        "ok": ok,
    }


def worker(
    id: str, started: float, ready: float | None, stopped: float, jobs=(), kind: str = "flex"
) -> dict:
    return {
        "id": id,
        "kind": kind,
        "started_at": started,
        "ready_at": ready,
        "stopped_at": stopped,
        "jobs": list(jobs),
    }


def W(**kw) -> Worker:
    return Worker.from_dict(worker(**kw))


def test_single_worker_worked_example():
    w = W(id="w1", started=0.0, ready=2.5, stopped=10.1, jobs=[job("j1", 3.0, 5.2)])
    # lifetime 10.1 s -> billed ceil(10.1) = 11 s
    assert billed_seconds(w) == 11
    s = time_split(w)
    # cold = 2.5 - 0.0 = 2.5; working = 5.2 - 3.0 = 2.2
    # idle = 11 - 2.5 - 2.2 = 6.3  (= 10.1 - 4.7 = 5.4 s of lifetime + 0.9 s of rounding)
    assert s.cold == pytest.approx(2.5)
    assert s.working == pytest.approx(2.2)
    assert s.idle == pytest.approx(6.3)
    assert s.billed == pytest.approx(11.0)
    shares = s.shares()
    # 2.5/11 = 0.22727..., 2.2/11 = 0.2, 6.3/11 = 0.57272...
    assert shares["cold"] == pytest.approx(0.2272727)
    assert shares["working"] == pytest.approx(0.2)
    assert shares["idle"] == pytest.approx(0.5727273)
    assert sum(shares.values()) == pytest.approx(1.0)
    # the JSON dict is accepted as well
    d = worker("w1", 0.0, 2.5, 10.1, jobs=[job("j1", 3.0, 5.2)])
    assert billed_seconds(d) == 11 and time_split(d) == s


def test_same_example_at_epoch_times():
    w = W(
        id="w1", started=T0, ready=T0 + 2.5, stopped=T0 + 10.1, jobs=[job("j1", T0 + 3.0, T0 + 5.2)]
    )
    assert billed_seconds(w) == 11
    s = time_split(w)
    assert (s.cold, s.working, s.idle) == pytest.approx((2.5, 2.2, 6.3), abs=1e-6)


def test_whole_second_lifetime_is_not_billed_an_extra_second_for_float_noise():
    # A stop time summed from float parts: 0.02 + 2 + 0.1 * 3 = 2.3200000000000003, so the
    # lifetime from 0.32 is 2.0000000000000004 s; that is still 2 billed seconds, not 3.
    stopped = 0.02 + 2 + 0.1 * 3
    assert stopped - 0.32 > 2.0
    assert billed_seconds(W(id="w", started=0.32, ready=1.0, stopped=stopped)) == 2
    # A real 1 ms over bills the next second.
    assert billed_seconds(W(id="w", started=T0, ready=T0, stopped=T0 + 3.001)) == 4


def test_overlapping_jobs_are_counted_once():
    w = W(
        id="w", started=0.0, ready=1.0, stopped=9.0, jobs=[job("a", 2.0, 6.0), job("b", 4.0, 8.0)]
    )
    s = time_split(w)
    # union of [2, 6] and [4, 8] is [2, 8] = 6 s (not 4 + 4 = 8 s)
    # billed 9: cold 1.0, working 6.0, idle 9 - 1 - 6 = 2.0
    assert (s.cold, s.working, s.idle) == pytest.approx((1.0, 6.0, 2.0))


def test_union_length():
    assert union_length([]) == 0
    # [0,1] + [1,3] touch -> 3; [5,6] apart -> +1; [2,2.5] inside -> +0; empty [7,7] -> +0
    assert union_length([(5, 6), (0, 1), (1, 3), (2, 2.5), (7, 7)]) == pytest.approx(4.0)


def test_two_workers_are_rounded_separately():
    rec = {
        "workers": [worker("a", 0.0, 0.1, 0.2), worker("b", 100.0, 100.1, 100.2)],
        "window": {"start": 0.0, "end": 100.2},
    }
    r = summarize(rec, PLACEHOLDER, active_workers=1)
    # each lifetime is 0.2 s -> ceil = 1 s each -> 2 s billed, not ceil(0.4) = 1
    assert [wc.billed_s for wc in r.workers] == [1, 1]
    assert r.billed_s == 2
    # 2 s x 0.01 XXX/s = 0.02
    assert r.total_cost == pytest.approx(0.02)
    # no successful job: nothing to divide by
    assert r.cost_per_job is None and r.cost_per_audio_hour is None and r.break_even is None


def test_never_ready_worker_is_all_cold():
    s = time_split(W(id="w", started=0.0, ready=None, stopped=4.5))
    # billed ceil(4.5) = 5: cold 4.5, working 0, idle 0.5 (the rounding)
    assert (s.cold, s.working, s.idle) == pytest.approx((4.5, 0.0, 0.5))


def test_job_taken_before_ready_is_not_counted_twice():
    # Defensive: a marker written late must not make cold + working exceed the lifetime.
    s = time_split(W(id="w", started=0.0, ready=3.0, stopped=5.0, jobs=[job("j", 2.0, 4.0)]))
    # cold 3, working clipped to [3, 4] = 1, idle 5 - 3 - 1 = 1
    assert (s.cold, s.working, s.idle) == pytest.approx((3.0, 1.0, 1.0))


MIXED = {
    "workers": [
        # flex worker of the first example: billed 11 s
        worker(
            "flex-1",
            0.0,
            2.5,
            10.1,
            jobs=[
                job("j1", 3.0, 5.2, audio=30.0, submitted=1.0),
                job("j2", 6.0, 6.5, audio=10.0, ok=False),
            ],
        ),
        # active worker alive 5.0 -> 24.4: billed ceil(19.4) = 20 s
        worker(
            "active-1",
            5.0,
            6.0,
            24.4,
            kind="active",
            jobs=[
                job("j3", 8.0, 14.0, audio=60.0),
            ],
        ),
    ],
    "window": {"start": 0.0, "end": 99.5},
}


def test_rates_cost_per_job_and_per_audio_hour():
    r = summarize(MIXED, PLACEHOLDER)
    # flex 11 s x 0.01 = 0.11; active 20 s x 0.006 = 0.12; total 0.23
    assert [wc.billed_s for wc in r.workers] == [11, 20]
    assert [wc.cost for wc in r.workers] == pytest.approx([0.11, 0.12])
    assert r.total_cost == pytest.approx(0.23)
    # 3 jobs, 2 ok; audio of ok jobs = 30 + 60 = 90 s = 0.025 h (failed j2 not counted)
    assert (r.jobs, r.ok_jobs, r.audio_s) == (3, 2, pytest.approx(90.0))
    # per ok job: 0.23 / 2 = 0.115; per audio hour: 0.23 / 0.025 = 9.2
    assert r.cost_per_job == pytest.approx(0.115)
    assert r.cost_per_audio_hour == pytest.approx(9.2)
    # shares of 31 billed s: cold 2.5 + 1.0 = 3.5; working 2.2 + 0.5 + 6.0 = 8.7;
    # idle 31 - 3.5 - 8.7 = 18.8
    assert (r.split.cold, r.split.working, r.split.idle) == pytest.approx((3.5, 8.7, 18.8))
    assert sum(r.shares.values()) == pytest.approx(1.0)
    # load: 90 audio s over a 99.5 s window
    assert r.load == pytest.approx(90.0 / 99.5)
    json.dumps(r.to_dict())  # the report must be writable as JSON


def test_active_cost_for_the_window():
    r = summarize(MIXED, PLACEHOLDER)
    # the two workers overlap (5.0 -> 10.1): peak 2 active workers;
    # window 99.5 s -> billed 100 s each: 2 x 100 x 0.006 = 1.2; per audio hour 1.2 / 0.025 = 48
    assert r.active_workers == 2
    assert r.active_cost == pytest.approx(1.2)
    assert r.active_cost_per_audio_hour == pytest.approx(48.0)
    r1 = summarize(MIXED, PLACEHOLDER, active_workers=1)
    assert r1.active_cost == pytest.approx(0.6)


def test_peak_concurrency_stop_then_start_at_same_instant_is_not_overlap():
    ws = [
        W(id="a", started=0.0, ready=1.0, stopped=5.0),
        W(id="b", started=5.0, ready=6.0, stopped=9.0),
        W(id="c", started=6.0, ready=7.0, stopped=7.5),
    ]
    assert peak_concurrent_workers(ws) == 2
    assert peak_concurrent_workers([]) == 0


def test_break_even_worked_example():
    # w = 0.1 working s per audio s (10x real time), o = 9 s cold + idle per job,
    # a = 30 audio s per job -> k = 0.1 + 9 / 30 = 0.4 billed s per audio s
    # L* = 0.006 / (0.01 x 0.4) = 1.5 audio hours per hour for one active worker
    # u* = 0.1 x 1.5 = 0.15 (= price ratio 0.6 x working share 0.1 / 0.4)
    be = break_even(
        PLACEHOLDER, working_s_per_audio_s=0.1, overhead_s_per_job=9.0, audio_s_per_job=30.0
    )
    assert be.flex_billed_s_per_audio_s == pytest.approx(0.4)
    assert be.load == pytest.approx(1.5)
    assert be.utilisation == pytest.approx(0.15)
    assert be.reachable
    # both sides cost the same per hour there: flex 0.01 x 0.4 x 1.5 x 3600 = 21.6,
    # active 0.006 x 3600 = 21.6
    assert 0.01 * 0.4 * be.load * 3600 == pytest.approx(0.006 * 3600)
    # per audio hour: flex 0.01 x 0.4 x 3600 = 14.4 at any load; active 21.6 / 1.5 = 14.4
    assert flex_cost_per_audio_hour(PLACEHOLDER, 0.4) == pytest.approx(14.4)
    assert active_cost_per_audio_hour(PLACEHOLDER, 1.5) == pytest.approx(14.4)
    assert active_cost_per_audio_hour(PLACEHOLDER, 3.0, active_workers=2) == pytest.approx(14.4)


def test_break_even_unreachable_when_active_is_dearer():
    # active 0.02 > flex 0.01, no overhead: k = w = 0.5 -> L* = 0.02 / 0.005 = 4, u* = 2 > 1
    be = break_even(
        _Rates(0.01, 0.02, "XXX"),
        working_s_per_audio_s=0.5,
        overhead_s_per_job=0.0,
        audio_s_per_job=10.0,
    )
    assert be.load == pytest.approx(4.0)
    assert be.utilisation == pytest.approx(2.0)
    assert not be.reachable


def test_summarize_break_even_uses_the_measured_billed_seconds():
    # One flex worker: billed 11 s, working 2.2 s, one ok job of 22 audio s.
    rec = {
        "workers": [worker("w", 0.0, 2.5, 10.1, jobs=[job("j", 3.0, 5.2, audio=22.0)])],
        "window": {"start": 0.0, "end": 10.1},
    }
    be = summarize(rec, PLACEHOLDER).break_even
    # w = 2.2 / 22 = 0.1; o = 2.5 + 6.3 = 8.8 per job; a = 22 -> k = 0.1 + 0.4 = 0.5 = 11 / 22
    # L* = 0.006 / (0.01 x 0.5) = 1.2; u* = 0.12
    assert be is not None
    assert be.flex_billed_s_per_audio_s == pytest.approx(0.5)
    assert be.load == pytest.approx(1.2)
    assert be.utilisation == pytest.approx(0.12)


def test_contract_is_strict_about_kind_and_rates():
    with pytest.raises(ValueError, match="kind"):
        Worker.from_dict(worker("w", 0.0, 1.0, 2.0, kind="spot"))
    with pytest.raises(KeyError):
        Worker.from_dict({"id": "w", "started_at": 0.0, "ready_at": 1.0, "stopped_at": 2.0})
    with pytest.raises(ValueError):
        _Rates(flex_per_s=-1.0, active_per_s=0.0)
    assert (
        _Rates.from_dict({"flex_per_s": "0.01", "active_per_s": 0.006, "currency": "XXX"})
        == PLACEHOLDER
    )
    with pytest.raises(ValueError, match="flex_per_sec"):
        _Rates.from_dict({"flex_per_sec": 0.01, "active_per_s": 0.006})
    rec = Record.from_dict(MIXED)
    assert rec.workers[0].jobs[0].submitted_at == 1.0
    assert len(rec.jobs) == 3
