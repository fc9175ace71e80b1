"""The benchmark harness: schedules, the local run end to end (JSON, table, plots,
production record), Remote mode pointed at the emulator's client API, and one run with
the real ``python -m handler`` worker and the tiny model.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.autoscaler import ScalerConfig
from bench.cost import Record, billed_seconds, time_split
from bench.harness import EndpointTarget, run_local, run_remote
from bench.report import check_phase_sum
from bench.scenarios import build, offline, pick, query_pool, read_trace, server
from runpod_emulator import Emulator

DATA = Path(__file__).parent / "data"
FAKE = Path(__file__).parent / "fake_workers" / "bench_worker.py"
PNG = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- schedules


def test_server_arrivals_are_seeded_poisson() -> None:
    queries = pick(query_pool(), 400, seed=1)
    a = server(queries, rate=2.0, seed=7)
    b = server(queries, rate=2.0, seed=7)
    assert [x.offset_s for x in a] == [x.offset_s for x in b]
    assert a[0].offset_s == 0.0
    gaps = [y.offset_s - x.offset_s for x, y in zip(a, a[1:], strict=False)]
    assert all(g >= 0 for g in gaps)
    assert 0.4 < statistics.mean(gaps) < 0.6  # 1 / rate
    assert server(queries, rate=2.0, seed=8)[5].offset_s != a[5].offset_s
    assert {x.offset_s for x in offline(queries[:3])} == {0.0}


def test_queries_are_real_speech_cycled_evenly() -> None:
    pool = query_pool()
    picked = pick(pool, 2 * len(pool), seed=3)
    assert sorted(q.name for q in picked) == sorted([q.name for q in pool] * 2)
    jfk = next(q for q in pool if q.name == "jfk")
    assert jfk.audio[:4] == b"RIFF" and 10.5 < jfk.audio_seconds < 11.5
    assert "audio_base64" in jfk.job_input()
    assert build("offline", jobs=4, options={"beam_size": 1})[0].query.job_input()["beam_size"] == 1
    with pytest.raises(ValueError):
        build("server", jobs=3)


def test_trace_replay(tmp_path: Path) -> None:
    shutil.copy(DATA / "jfk.wav", tmp_path / "a.wav")
    (tmp_path / "a.txt").write_text("reference words")
    trace = tmp_path / "trace.csv"
    trace.write_text(f"# t,audio\n100.5,a.wav\n\n100.0,{DATA / 'jfk.mp3'}\n103.25,a.wav\n")
    arrivals = read_trace(trace)
    assert [a.offset_s for a in arrivals] == [0.0, 0.5, 3.25]
    assert [a.query.name for a in arrivals] == ["jfk.mp3", "a.wav", "a.wav"]
    assert arrivals[1].query.reference == "reference words"
    assert arrivals[1].query is arrivals[2].query  # read once
    assert 10.5 < arrivals[0].query.audio_seconds < 11.5  # measured by decoding the MP3
    trace.write_text("soon,a.wav\n")
    with pytest.raises(ValueError, match="not a number"):
        read_trace(trace)


# --------------------------------------------------------------------------- local, fake worker


@pytest.mark.e2e
def test_local_command_writes_json_table_and_plots(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "local",
            "--scenario",
            "offline",
            "--jobs",
            "4",
            "--max-workers",
            "2",
            "--idle-timeout",
            "1",
            "--queue-delay",
            "1",
            "--worker-command",
            f"{sys.executable} {FAKE}",
            "--worker-env",
            "FAKE_STARTUP_S=0.3",
            "--flex-rate",
            "0.0002",
            "--active-rate",
            "0.00014",
            "--currency",
            "PLACEHOLDER",
            "--out",
            str(out),
            "--name",
            "t",
            "--quiet",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "first requests (cold)" in printed and "cost (PLACEHOLDER)" in printed
    for name in (
        "t.json",
        "t.txt",
        "t.production.json",
        "t-latency.png",
        "t-billed.png",
        "t-cost.png",
    ):
        assert (out / name).exists(), name
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == PNG
    record = json.loads((out / "t.json").read_text())
    assert record["scaled_to_zero"] is True
    rec = Record.from_dict(record)
    jobs = rec.jobs
    assert len(jobs) == 4 and all(j.ok for j in jobs) and record["unassigned_jobs"] == []
    for j in jobs:
        assert abs(check_phase_sum(j)) < 0.01
        assert j.submitted_at <= j.taken_at <= j.finished_at
    for w in rec.workers:
        split = time_split(w)
        assert split.billed == pytest.approx(billed_seconds(w))
        assert w.imports_done_at is not None and w.ready_at is not None
    for j in record["workers"][0]["jobs"]:
        assert j["delayTime"] is not None and j["executionTime"] is not None
    assert record["error_probe"]["status"] == "FAILED"
    assert record["error_probe"]["error_code"] == "DECODE_FAILED"
    summary = record["summary"]
    assert summary["completed"] == 4 and summary["cost"]["currency"] == "PLACEHOLDER"
    prod = json.loads((out / "t.production.json").read_text())
    assert prod["transcript"]["actual"] == "fake transcript"
    assert prod["sample_input"]["audio_base64"].endswith("characters omitted>")

    # The saved run re-priced: without rates the money lines are left out.
    assert main(["report", str(out / "t.json")]) == 0
    text = capsys.readouterr().out
    assert "cost lines omitted" in text and "cost (" not in text
    assert (
        main(
            [
                "report",
                str(out / "t.json"),
                str(out / "t.json"),
                "--flex-rate",
                "1",
                "--active-rate",
                "0.5",
                "--out",
                str(out),
                "--name",
                "both",
            ]
        )
        == 0
    )
    assert (out / "both-cost.png").read_bytes()[:8] == PNG


@pytest.mark.e2e
def test_remote_mode_against_the_emulator_client_api(tmp_path: Path) -> None:
    em = Emulator(
        worker_command=[sys.executable, str(FAKE)],
        ping_interval_ms=1000,
        log_dir=str(tmp_path),
        stop_grace_s=15.0,
    )
    with em:
        em.start_worker()
        target = EndpointTarget(em.config.endpoint_id, em.api_key, em.base_url)
        result = run_remote(build("offline", jobs=3), target, idle_timeout_s=5.0)
    record = result.record
    assert record["mode"] == "remote"
    (worker,) = record["workers"]
    assert worker["estimated"] is True and len(worker["jobs"]) == 3
    for j in worker["jobs"]:
        assert j["ok"] and j["delayTime"] is not None and j["executionTime"] is not None
        assert j["taken_at"] == pytest.approx(j["sent_at"] + j["delayTime"] / 1000)
    assert worker["stopped_at"] == pytest.approx(
        max(j["finished_at"] for j in worker["jobs"]) + 5.0
    )
    assert record["error_probe"]["error_code"] == "DECODE_FAILED"
    Record.from_dict(record)


# --------------------------------------------------------------------------- the real worker


@pytest.mark.e2e
@pytest.mark.model
def test_real_worker_local_run(tmp_path: Path) -> None:
    """`python -m handler` with the tiny model: the real cold start and phase timings."""
    arrivals = [a for a in build("offline", jobs=6, seed=0) if a.query.name.startswith("sense")][:2]
    scaler = ScalerConfig(
        max_workers=1, idle_timeout_s=1.0, env={"WHISPER_DEVICE": "cpu", "WHISPER_CPU_THREADS": "1"}
    )
    root = str(Path(__file__).resolve().parent.parent)
    with Emulator(ping_interval_ms=5000, worker_cwd=root, log_dir=str(tmp_path)) as em:
        result = run_local(
            arrivals,
            scaler=scaler,
            emulator=em,
            job_timeout_s=120,
            ready_timeout_s=120,
            probe_errors=False,
        )
    record = result.record
    assert record["scaled_to_zero"]
    (worker,) = record["workers"]
    for key in ("imports_done_at", "model_loaded_at", "warmup_done_at", "ready_at"):
        assert worker[key] is not None, key
    assert (
        worker["started_at"] - 1
        < worker["imports_done_at"]
        <= worker["model_loaded_at"]
        <= worker["warmup_done_at"]
        <= worker["ready_at"]
        < worker["stopped_at"]
    )
    assert len(worker["jobs"]) == 2
    for j in worker["jobs"]:
        assert j["ok"], j
        assert j["wer"] is not None and j["wer"] < 0.35
        # Parsing and temp-file clean-up sit between the timed phases: milliseconds.
        assert abs(check_phase_sum(j)) <= 0.05 + 0.05 * j["timings"]["total"]
        assert set(j["timings"]) >= {"fetch", "decode", "queue_model", "transcribe", "format"}
        # The worker's own total fits inside the platform's execution time.
        assert j["timings"]["total"] <= j["finished_at"] - j["taken_at"] + 0.01
    rec = Record.from_dict(record)
    split = time_split(rec.workers[0])
    assert split.cold > 0 and split.working > 0
    assert split.billed == pytest.approx(billed_seconds(rec.workers[0]))
