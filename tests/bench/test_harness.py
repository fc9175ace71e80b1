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
from bench.common.report import check_phase_sum
from bench.common.scenarios import build, offline, pick, query_pool, read_trace, server
from bench.cost.cost import Record, billed_seconds, time_split

DATA = Path(__file__).parent.parent / "data"
FAKE = Path(__file__).parent.parent / "fake_workers" / "bench_worker.py"
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
    # Every run named gets its own latency and billed plots, not the first only.
    assert (out / "both-t-latency.png").exists() and (out / "both-t-billed.png").exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_run_that_reached_nothing_fails_loudly(tmp_path: Path, capsys, monkeypatch) -> None:
    """Against an unreachable endpoint the table used to say ``failed
    jobs 0``, the run exited 0 and drew empty plots. Real client, a closed 127.0.0.1 port."""
    monkeypatch.setenv("RUNPOD_API_KEY", "not-a-key")
    out = tmp_path / "out"
    code = main(
        [
            "remote",
            "--endpoint",
            "x",
            "--base-url",
            f"http://127.0.0.1:{_closed_port()}/v2",
            "--scenario",
            "offline",
            "--jobs",
            "2",
            "--no-probe",
            "--quiet",
            "--out",
            str(out),
            "--name",
            "r",
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "failed jobs                  2   CONNECTION_ERROR 2" in captured.out
    assert "did not complete" in captured.err
    record = json.loads((out / "r.json").read_text())
    assert record["summary"]["failed_by_code"] == {"CONNECTION_ERROR": 2}
    assert not list(out.glob("*.png"))


def test_cost_plot_reads_as_money_and_names_every_run() -> None:
    """The cost plot's ticks read as money and loads (it had ``6x10^0``
    ticks) and every measured run is labelled (its points were anonymous)."""
    from bench.common.plots import cost_figure
    from bench.cost.cost import summarize
    from tests.bench.test_report import PLACEHOLDER, RECORD

    cost = summarize(RECORD, PLACEHOLDER, active_workers=1)
    fig = cost_figure([cost, cost], labels=["low-load", "high-load"])
    (ax,) = fig.axes
    ys = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    xs = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    for ticks in (ys, xs):  # plain amounts, not mathtext powers of ten
        assert ticks and all(float(t) > 0 and "$" not in t for t in ticks), ticks
    texts = [t.get_text() for t in ax.texts]
    assert "low-load" in texts and "high-load" in texts
    assert "$" not in ax.get_ylabel() and "XXX" in ax.get_ylabel()
