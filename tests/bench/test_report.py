"""Tests for bench/common/report.py on small literal records: nearest-rank percentiles, cold and
warm latency kept apart, real-time factor, the phase-sum residual, the cold-start split,
the table and the production record. Rates are placeholders (currency "XXX")."""

from __future__ import annotations

import json

import pytest

from bench.common.report import (
    check_phase_sum,
    cold_start,
    job_samples,
    latency_stats,
    overall_rtf,
    percentiles,
    phase_breakdown,
    production_record,
    redact,
    render_table,
    rtf,
)
from bench.cost.cost import Job, Rates, Worker, summarize

PLACEHOLDER = Rates(flex_per_s=0.01, active_per_s=0.006, currency="XXX")

TIMINGS = {
    "fetch": 0.1,
    "decode": 0.2,
    "queue_model": 0.05,
    "transcribe": 1.1,
    "format": 0.05,
    "total": 1.55,
}

RECORD = {
    "workers": [
        {
            "id": "w1",
            "kind": "flex",
            "started_at": 0.0,
            "imports_done_at": 2.0,
            "model_loaded_at": 3.5,
            "warmup_done_at": 4.0,
            "ready_at": 4.2,
            "stopped_at": 14.0,
            "jobs": [
                # sent at 1.0 while w1 was starting: cold, latency 7.0 - 1.0 = 6.0
                {
                    "id": "j1",
                    "submitted_at": 1.0,
                    "taken_at": 4.3,
                    "finished_at": 7.0,
                    "audio_seconds": 11.0,
                    "timings": TIMINGS,
                    "ok": True,
                },
                # sent at 6.0 after w1 was ready: warm, latency 8.0 - 6.0 = 2.0
                {
                    "id": "j2",
                    "submitted_at": 6.0,
                    "taken_at": 7.0,
                    "finished_at": 8.0,
                    "audio_seconds": 11.0,
                    "timings": TIMINGS,
                    "ok": True,
                },
                {
                    "id": "j4",
                    "submitted_at": 8.5,
                    "taken_at": 8.6,
                    "finished_at": 8.7,
                    "audio_seconds": 0.0,
                    "ok": False,
                },
            ],
        },
        {
            "id": "w2",
            "kind": "flex",
            "started_at": 10.0,
            "ready_at": 20.0,
            "stopped_at": 27.5,
            "jobs": [
                # sent at 21.0, w2 ready since 20.0: warm, latency 1.5
                {
                    "id": "j3",
                    "submitted_at": 21.0,
                    "taken_at": 21.1,
                    "finished_at": 22.5,
                    "audio_seconds": 22.0,
                    "ok": True,
                },
            ],
        },
    ],
    "window": {"start": 0.0, "end": 27.5},
}


def test_percentiles_nearest_rank():
    # n = 5: rank = ceil(q/100 * 5): p30 -> ceil(1.5) = 2 -> 20; p40 -> 2 -> 20;
    # p50 -> ceil(2.5) = 3 -> 35; p100 -> 5 -> 50; p0 -> the minimum
    xs = [35, 20, 50, 15, 40]
    assert percentiles(xs, (0, 30, 40, 50, 100)) == {0: 15, 30: 20, 40: 20, 50: 35, 100: 50}
    # n = 20 values 1..20: p95 -> rank 19 -> 19; p99 -> ceil(19.8) = 20 -> 20 (the max)
    assert percentiles(range(1, 21), (50, 95, 99)) == {50: 10, 95: 19, 99: 20}
    assert percentiles([], (50, 99)) == {50: None, 99: None}
    with pytest.raises(ValueError):
        percentiles([1.0], (101,))


def test_cold_and_warm_latency_are_apart():
    samples = {s.job_id: s for s in job_samples(RECORD)}
    assert samples["j1"].cold and samples["j1"].latency == pytest.approx(6.0)
    assert not samples["j2"].cold and samples["j2"].latency == pytest.approx(2.0)
    assert not samples["j3"].cold and samples["j3"].latency == pytest.approx(1.5)
    stats = latency_stats(RECORD)
    assert stats["cold"]["n"] == 1
    assert stats["cold"]["percentiles"] == {50: 6.0, 95: 6.0, 99: 6.0}
    # warm: [1.5, 2.0]; p50 rank ceil(1.0) = 1 -> 1.5; p95 rank 2 -> 2.0
    assert stats["warm"]["n"] == 2
    assert stats["warm"]["percentiles"] == {50: 1.5, 95: 2.0, 99: 2.0}
    # the failed job is counted, not mixed into the latency
    assert stats["failed"]["n"] == 1


def test_real_time_factor():
    j = Job.from_dict(RECORD["workers"][0]["jobs"][0])
    # 1.1 s of transcription for 11 s of audio
    assert rtf(j) == pytest.approx(0.1)
    # j3 has no timings and is left out: (1.1 + 1.1) / (11 + 11) = 0.1
    assert overall_rtf(RECORD) == pytest.approx(0.1)


def test_phase_sum_residual():
    j = Job.from_dict(RECORD["workers"][0]["jobs"][0])
    # 1.55 - (0.1 + 0.2 + 0.05 + 1.1 + 0.05) = 1.55 - 1.5 = 0.05 unaccounted
    assert check_phase_sum(j) == pytest.approx(0.05)
    assert check_phase_sum(RECORD["workers"][0]["jobs"][0]) == pytest.approx(0.05)  # a dict
    exact = Job.from_dict({**RECORD["workers"][0]["jobs"][0], "timings": {**TIMINGS, "total": 1.5}})
    assert check_phase_sum(exact) == pytest.approx(0.0, abs=1e-12)
    # an extra phase the worker adds (an upload) is counted too
    extra = Job.from_dict(
        {**RECORD["workers"][0]["jobs"][0], "timings": {**TIMINGS, "upload": 0.05}}
    )
    assert check_phase_sum(extra) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        check_phase_sum(Job.from_dict(RECORD["workers"][1]["jobs"][0]))


def test_phase_breakdown():
    ph = phase_breakdown(RECORD)
    # queue wait of ok jobs: 4.3 - 1.0 = 3.3, 7.0 - 6.0 = 1.0, 21.1 - 21.0 = 0.1
    assert ph["queue_wait"]["mean"] == pytest.approx((3.3 + 1.0 + 0.1) / 3)
    assert ph["transcribe"]["p50"] == pytest.approx(1.1)
    # post: (7.0 - 4.3) - 1.55 = 1.15 and (8.0 - 7.0) - 1.55 = -0.55
    assert ph["post"]["mean"] == pytest.approx((1.15 - 0.55) / 2)


def test_cold_start_split_adds_up():
    c = cold_start(Worker.from_dict(RECORD["workers"][0]))
    # imports 2.0 - 0.0; load 3.5 - 2.0; warm-up 4.0 - 3.5; other 4.2 - 4.0; total 4.2
    assert (c.imports, c.load, c.warmup, c.other, c.total) == pytest.approx(
        (2.0, 1.5, 0.5, 0.2, 4.2)
    )
    # model loaded during the imports (at 1.5 < 2.0): its time is hidden, load = 0,
    # warm-up = 4.0 - 2.0 = 2.0; still 2.0 + 0 + 2.0 + 0.2 = 4.2
    overlapped = Worker.from_dict({**RECORD["workers"][0], "model_loaded_at": 1.5})
    c = cold_start(overlapped)
    assert (c.imports, c.load, c.warmup, c.other) == pytest.approx((2.0, 0.0, 2.0, 0.2))
    assert c.imports + c.load + c.warmup + c.other == pytest.approx(c.total)
    # no markers: everything is "other"
    c = cold_start(Worker.from_dict(RECORD["workers"][1]))
    assert (c.imports, c.load, c.warmup, c.other, c.total) == pytest.approx(
        (0.0, 0.0, 0.0, 10.0, 10.0)
    )


def test_render_table():
    cr = summarize(RECORD, PLACEHOLDER)
    table = render_table(RECORD, cr)
    print(table)
    lines = table.splitlines()
    cold = next(line for line in lines if line.startswith("first requests (cold)"))
    assert cold.split()[-4:] == ["1", "6.00", "6.00", "6.00"]
    warm = next(line for line in lines if line.startswith("warm requests"))
    assert warm.split()[-4:] == ["2", "1.50", "2.00", "2.00"]
    # billed: w1 ceil(14.0) = 14, w2 ceil(17.5) = 18 -> 32 s
    billed = next(line for line in lines if line.startswith("billed seconds"))
    assert billed.split()[2] == "32"
    # cost 32 x 0.01 = 0.32 XXX; audio of ok jobs 11 + 11 + 22 = 44 s = 0.01222 h
    # -> 0.32 / (44 / 3600) = 26.18 per audio hour
    cost = next(line for line in lines if line.startswith("cost (XXX)"))
    assert "0.32" in cost and "per audio hour 26.18" in cost
    assert "real-time factor" in table and "0.100" in table
    assert max(len(line) for line in lines) <= 100


def test_production_record_keeps_everything_and_leaks_nothing():
    cr = summarize(RECORD, PLACEHOLDER)
    pr = production_record(
        model="tiny.en",
        settings={"model": "tiny.en", "device": "cpu", "aws_secret_access_key": "hunter2"},
        sample_input={
            "audio": "https://bucket.example/a.wav?X-Amz-Signature=abc",
            "audio_base64": "QUJD" * 100,
            "language": "en",
        },
        expected_transcript="ask not what your country can do for you",
        actual_transcript="ask not what your country can do for you",
        error_behaviour={"zero bytes": {"error_code": "EMPTY_AUDIO", "retryable": False}},
        record=RECORD,
        cost_report=cr,
    )
    text = json.dumps(pr)
    assert "hunter2" not in text and "X-Amz-Signature" not in text and "QUJDQUJD" not in text
    assert pr["sample_input"]["audio"] == "https://bucket.example/a.wav"
    assert pr["sample_input"]["audio_base64"] == "<400 characters omitted>"
    assert pr["settings"]["aws_secret_access_key"] == "<redacted>"
    assert pr["runtime"]["python"].count(".") == 2
    assert pr["runtime"]["faster-whisper"] and pr["runtime"]["ctranslate2"]
    assert pr["transcript"]["expected"] == pr["transcript"]["actual"]
    assert pr["latency"]["jobs"]["cold"]["percentiles"]["p50"] == 6.0
    assert pr["latency"]["cold_start"]["n"] == 2
    assert pr["billing"]["billed_s"] == 32
    assert pr["error_behaviour"]["zero bytes"]["error_code"] == "EMPTY_AUDIO"


def test_redact_is_recursive_and_leaves_plain_values():
    assert redact({"a": [{"api_key": "k"}, "s3://b/k?x=1"], "n": 3, "none": None}) == {
        "a": [{"api_key": "<redacted>"}, "s3://b/k"],
        "n": 3,
        "none": None,
    }


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plots_write_png_files(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.common.plots import plot_billed_split, plot_cost_vs_load, plot_latency

    cr = summarize(RECORD, PLACEHOLDER)
    # a second, busier run of the same shape gives the cost plot two measured loads
    busier = summarize(
        {**RECORD, "window": {"start": 0.0, "end": 14.0}}, PLACEHOLDER, active_workers=1
    )
    paths = [
        plot_latency(RECORD, tmp_path / "latency.png"),
        plot_billed_split(cr, tmp_path / "billed.png"),
        plot_cost_vs_load([cr, busier], tmp_path / "sub" / "cost.png"),
    ]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG_SIGNATURE, p
        assert len(data) > 5_000, p


def test_cost_plot_without_any_successful_job(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.common.plots import plot_cost_vs_load

    empty = summarize({"workers": [], "window": {"start": 0.0, "end": 1.0}}, PLACEHOLDER)
    assert plot_cost_vs_load(empty, tmp_path / "c.png").read_bytes()[:8] == PNG_SIGNATURE
