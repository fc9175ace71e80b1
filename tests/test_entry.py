"""`python -m handler` (the SDK's local test mode) and the `whisper-worker` CLI, as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from handler.contract import parse_startup_line
from tests.helpers import DATA, JFK_TEXT, b64, wer

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], *, stdin: str | None = None, env: dict | None = None, cwd=ROOT):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("WHISPER_", "RUNPOD_"))}
    full_env.update({"HF_HUB_OFFLINE": "1", **(env or {})})
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )


def test_worker_runs_test_input_and_exits_zero():
    proc = run(["-m", "handler"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "completed successfully" in out
    assert "ask not what your country can do for you" in out
    startup = [d for line in proc.stderr.splitlines() if (d := parse_startup_line(line))]
    times = startup[0]
    assert times["model_load"] > 0 and times["runpod_import"] > 0
    assert times["marks"]["model_loaded"] >= times["marks"]["imports_done"]


def test_worker_local_job_error_exits_one(tmp_path):
    (tmp_path / "test_input.json").write_text(json.dumps({"input": {"audio_base64": "!!"}}))
    proc = run(["-m", "handler"], cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"WHISPER_MODEL": "no-such-model"}, "unknown model 'no-such-model'"),
        ({"WHISPER_MODEL": "large-v3"}, "cannot load model 'large-v3'"),
        ({"WHISPER_DEVICE": "tpu"}, "WHISPER_DEVICE"),
        ({"WHISPER_MODLE": "tiny"}, "WHISPER_MODLE"),
    ],
)
def test_unloadable_model_or_bad_setting_exits_one_with_one_line(env, needle):
    proc = run(["-m", "handler"], env=env)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("whisper-worker: ") and needle in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "Starting Serverless Worker" not in proc.stdout + proc.stderr


def test_cli_job_from_stdin():
    job = {"input": {"audio_base64": b64(DATA / "jfk.mp3"), "output": ["text", "srt"]}}
    proc = run(["-m", "handler.cli", "job", "-"], stdin=json.dumps(job))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert wer(JFK_TEXT, result["text"]) <= 0.05 and result["srt"].startswith("1\n")


def test_cli_job_error_exits_one(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"input": {"audio_url": "ftp://example.com/a.wav"}}))
    proc = run(["-m", "handler.cli", "job", str(path)])
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error_code"] == "URL_NOT_ALLOWED"


def test_cli_transcribe_prints_vtt():
    proc = run(["-m", "handler.cli", "transcribe", str(DATA / "jfk.wav"), "-f", "vtt"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("WEBVTT")
    assert "ask not what your country" in proc.stdout.replace("\n", " ")


def test_the_loader_thread_imports_nothing():
    """The model load runs in a thread beside `import runpod`; two threads importing at
    once can see a partially initialised module (it happened with requests.utils), so
    everything the load and the warm-up need is imported before the thread starts."""
    script = (
        "import sys\n"
        "from handler.startup import StartupTimes, prepare, load_models\n"
        "times = StartupTimes()\n"
        "plan = prepare(times)\n"
        "before = set(sys.modules)\n"
        "loaded = load_models(plan, times)\n"
        "assert loaded.models, loaded\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    proc = run(["-c", script], env={"WHISPER_DEVICE": "cpu", "WHISPER_WARMUP": "true"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


# --- what a new user hits -------------------------------------------------------


def test_offline_model_error_says_how_to_fetch_it(tmp_path):
    proc = run(
        ["-m", "handler.cli", "transcribe", str(DATA / "jfk.wav")],
        env={"WHISPER_MODEL": "large-v3", "HF_HOME": str(tmp_path)},
    )
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "python -m builder.fetch_model --model large-v3" in line
    assert "local_files_only" not in line


def test_cuda_asked_on_a_machine_without_one_says_so():
    from handler.inference.models import cuda_device_count

    if cuda_device_count():
        pytest.skip("this machine has a GPU")
    proc = run(
        ["-m", "handler.cli", "transcribe", str(DATA / "jfk.wav")], env={"WHISPER_DEVICE": "cuda"}
    )
    assert proc.returncode == 1
    assert "no CUDA device" in proc.stderr and "WHISPER_DEVICE=auto" in proc.stderr
    assert "snapshot" not in proc.stderr


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing.json", "no such file"),
        (lambda p: DATA / "jfk.wav", "not a JSON text file"),
        (lambda p: (p / "deep.json").write_text("[" * 100_000) and p / "deep.json", "nested"),
    ],
    ids=["missing", "audio-instead-of-json", "deeply-nested"],
)
def test_cli_job_bad_files_give_one_line_and_exit_two(tmp_path, make, needle):
    proc = run(["-m", "handler.cli", "job", str(make(tmp_path))])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_transcribe_streams_segments_and_breaks_text_at_segment_ends():
    proc = run(["-m", "handler.cli", "transcribe", str(DATA / "jfk.wav"), "--stream", "-v"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) >= 2 and all(line.startswith("[") and "->" in line for line in lines)
    proc = run(["-m", "handler.cli", "transcribe", str(DATA / "jfk.wav")])
    lines = proc.stdout.strip().splitlines()
    assert len(lines) >= 2 and wer(" ".join(lines), JFK_TEXT) < 0.15
    assert "%" not in proc.stderr  # no progress bar when stderr is not a terminal


def test_cli_transcribes_a_stereo_call_a_line_per_turn_with_its_channel(tmp_path):
    from tests.media import write_call_wav

    call = str(write_call_wav(tmp_path / "call.wav"))
    proc = run(["-m", "handler.cli", "transcribe", call, "--multichannel"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["channel 0", "channel 1", "channel 0"]


def test_every_cli_option_has_help():
    from handler.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        assert p.description, name
        for action in p._actions:
            assert action.help, (name, action.dest)
            assert "``" not in action.help


@pytest.mark.parametrize(
    "entry", ["import handler.pipeline.job", "import handler.cli", "import handler.__main__"]
)  # noqa: E501
def test_openmp_waits_passively_however_the_worker_is_entered(entry):
    """The worker set OMP_WAIT_POLICY=PASSIVE in startup.prepare, but libgomp
    reads it once, when CTranslate2 is first imported, and importing the pipeline already
    imported CTranslate2, so the setting never took effect: idle OpenMP threads spun
    (GOMP_SPINCOUNT 300000), and beside another process's load the queue worker took 24 s
    for 73 s of audio against 7.6 s with the variable set in the environment. libgomp
    prints what it read with OMP_DISPLAY_ENV=VERBOSE; the spin count must be 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    proc = subprocess.run(
        [sys.executable, "-c", entry],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GOMP_SPINCOUNT = '0'" in proc.stderr, proc.stderr[-2000:]


def test_a_deployment_that_chose_a_wait_policy_keeps_it():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env.update(OMP_DISPLAY_ENV="VERBOSE", OMP_WAIT_POLICY="ACTIVE")
    proc = subprocess.run(
        [sys.executable, "-c", "import handler.pipeline.job"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in proc.stderr, proc.stderr[-2000:]
