"""One recording fanned out across workers (e2e tier): `split` on the real worker
under the real runpod SDK loop against the local emulator, the pieces ordinary jobs of the
same endpoint taken by two real worker processes, stitched back into one result.

The cut points (VAD silences near equal shares) and the stitching are checked on real
speech; a piece cancelled by someone else is submitted again; one that fails twice fails the
whole job naming it; cancelling the job cancels its pieces.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import srt

from handler.errors import Code
from handler.pipeline.job import run_job
from runpod_emulator import Emulator
from speech_assets.clips import long_clip
from tests.helpers import DATA, JFK_TEXT, make_settings, wait_for, wer
from tests.test_platform import long_job

ROOT = Path(__file__).resolve().parent.parent
READY_S = 120.0
JOB_S = 300.0


def test_cuts_fall_in_silence_near_equal_shares() -> None:
    from handler.inference import pieces

    clip = long_clip(60)
    audio = clip.samples
    cuts = pieces.cut_points(audio, 3)
    assert len(cuts) == 2 and cuts == sorted(cuts)
    for k, cut in enumerate(cuts, start=1):
        assert abs(cut - k * len(audio) / 3) < 0.2 * len(audio) / 3
        around = audio[cut - 1600 : cut + 1600]  # 0.1 s each side: silence
        assert float(np.abs(around).max()) < 0.01
    # A long quiet stretch spanning several shares is cut at each share, not once in its
    # middle (which made 2 pieces of the 3 asked for).
    quiet = np.concatenate([long_clip(10).samples, np.zeros(50 * 16000, np.float32)])
    cuts = pieces.cut_points(quiet, 3)
    share = len(quiet) / 3
    assert len(cuts) == 2 and all(abs(c - k * share) < 0.2 * share for k, c in enumerate(cuts, 1))
    # A long recording's VAD runs in shares on several cores (each read from 30 s earlier):
    # the speech it finds is the single pass's but for a window here and there after a
    # share's start, and the cuts fall in the same pauses.
    ten = long_clip(600).samples
    one, two = pieces.speech(ten, cores=1), pieces.speech(ten, cores=2)

    def total(spans: list[dict[str, int]]) -> int:
        return sum(s["end"] - s["start"] for s in spans)

    assert abs(total(two) - total(one)) < 0.002 * total(one)
    for x, y in ((one, two), (two, one)):
        assert all(any(s["start"] < t["end"] and t["start"] < s["end"] for t in y) for s in x)
    for n in (2, 3, 5, 8):
        by_one, by_two = pieces.cut_points(ten, n, spans=one), pieces.cut_points(ten, n, spans=two)
        assert len(by_one) == len(by_two) == n - 1
        assert all(abs(c - d) < 8000 for c, d in zip(by_one, by_two, strict=True))
    assert pieces.count("auto", 3600, 240, 32) == 15
    assert pieces.count(8, 30, 240, 32) == 3  # no piece under 10 s
    assert pieces.count(64, 7200, 240, 32) == 32


def test_split_on_a_worker_that_cannot_is_refused_before_the_audio(worker) -> None:
    result = run_job({"audio_url": "https://example.com/a.mp3", "split": 4}, worker)
    assert result["error_code"] == Code.SPLIT_UNAVAILABLE and not result["retryable"]
    assert "RUNPOD_API_KEY" in result["error"]
    bad = run_job({"audio_url": "https://example.com/a.mp3", "speaker_embeddings": True}, worker)
    assert bad["error_code"] == Code.INVALID_INPUT and "diarize" in bad["error"]


def test_pieces_stream_in_time_order_as_soon_as_those_before_them_have_ended() -> None:
    """Pieces end in any order; their segments reach the caller's stream on the recording's
    time line, numbered once, as soon as every earlier piece has ended, and the progress
    moves with the audio of the pieces ended."""
    from handler.pipeline.runtime import Call
    from handler.pipeline.split import Stitch

    streamed: list[tuple[int, float, str]] = []
    progress: list[float] = []
    call = Call(
        "j",
        None,
        lambda seg: streamed.append((seg["id"], seg["start"], seg["text"])),
        progress.append,
    )
    bounds = [(0, 160000), (160000, 480000), (480000, 640000)]  # 10 s, 20 s, 10 s
    stitch = Stitch(bounds, call, 40.0)

    def output(text: str) -> dict[str, Any]:
        return {
            "segments": [
                {"id": k, "start": 2.0 * k - 1, "end": 2.0 * k, "text": f" {text} {k}"}
                for k in (1, 2)
            ]
        }

    stitch.done(2, output("third"))
    assert streamed == [] and progress == [25.0]  # nothing before it has ended
    stitch.done(0, output("first"))
    assert [s[2] for s in streamed] == [" first 1", " first 2"] and progress[-1] == 50.0
    stitch.done(1, output("second"))
    assert [s[0] for s in streamed] == [1, 2, 3, 4, 5, 6]
    assert [s[1] for s in streamed] == [1.0, 3.0, 11.0, 13.0, 31.0, 33.0]
    assert [s[2].split()[0] for s in streamed] == ["first"] * 2 + ["second"] * 2 + ["third"] * 2
    assert progress == [25.0, 50.0, 100.0]
    assert [s["id"] for s in stitch.segments] == [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory) -> Any:
    logs = tmp_path_factory.mktemp("fanout")
    em = Emulator(ping_interval_ms=1000, stop_grace_s=30.0, log_dir=str(logs)).start()
    try:
        from speech_assets.diarization import diarizer_dir

        env = {
            "WHISPER_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "RUNPOD_API_KEY": em.api_key,
            "WHISPER_MAX_CONCURRENCY": "3",
            "TMPDIR": str(logs),
            "WHISPER_DIARIZATION": "true",
            "WHISPER_DIARIZATION_MODEL": str(diarizer_dir()),
        }
        wids = [
            em.start_worker(env, command=[sys.executable, "-m", "handler"], cwd=str(ROOT))
            for _ in range(2)
        ]
        for wid in wids:
            em.wait_worker(wid, {"idle", "busy"}, READY_S)
        yield em
    finally:
        em.stop()


def _children(em: Emulator, parent: str) -> list[Any]:
    with em.state.cond:
        return [
            j
            for j in em.state.jobs.values()
            if j.id != parent
            and isinstance(j.input, dict)
            and "split" not in j.input
            and j.submitted_at >= em.state.jobs[parent].submitted_at
        ]


@pytest.mark.e2e
def test_a_split_job_is_pieces_on_the_queue_stitched_into_one_result(endpoint) -> None:
    em = endpoint
    job = {
        **long_job(75),
        "output": ["text", "segments", "srt", "verbose_json"],
        "word_alignment": "forced",
    }
    whole = em.wait_job(em.submit(job), JOB_S)
    assert whole["status"] == "COMPLETED", whole
    parent = em.submit({**job, "split": 3})
    status = em.wait_job(parent, JOB_S)
    assert status["status"] == "COMPLETED", status
    out = status["output"]
    children = _children(em, parent)
    assert len(children) == 3 and all(c.status == "COMPLETED" for c in children)
    # Each piece aligned its own words (the parent holds no audio it could align with).
    assert all(c.input["word_alignment"] == "forced" for c in children)
    assert all(c.output["word_alignment"] == "forced" for c in children)
    assert out["word_alignment"] == whole["output"]["word_alignment"] == "forced"
    # One ordinary result: the same words as unsplit, in time order, numbered once.
    assert wer(whole["output"]["text"], out["text"]) <= 0.05, (whole["output"]["text"], out)
    segs = out["segments"]
    assert [s["id"] for s in segs] == list(range(1, len(segs) + 1))
    assert all(a["start"] <= b["start"] for a, b in zip(segs, segs[1:], strict=False))
    assert segs[-1]["end"] <= out["duration"] + 0.5
    cues = list(srt.parse(out["srt"]))  # built once, from the whole: numbered 1..n in time
    assert [c.index for c in cues] == list(range(1, len(cues) + 1))
    assert all(a.start <= b.start for a, b in zip(cues, cues[1:], strict=False))
    assert cues[-1].end.total_seconds() > 0.8 * out["duration"]
    assert out["verbose_json"]["text"] == out["text"]
    assert [p["piece"] for p in out["pieces"]] == [1, 2, 3]
    assert out["pieces"][0]["start"] == 0 and abs(out["pieces"][-1]["end"] - out["duration"]) < 0.1
    assert all(p["tries"] == 1 for p in out["pieces"])
    # Each piece lives no longer than the job waits for it (an orphan is dropped, not run
    # hours later), and the job's progress moved as each piece ended, not once at the end.
    from handler.faces.fanout import PIECE_TIMEOUT_S

    assert all(c.ttl_s == PIECE_TIMEOUT_S for c in children)
    wait_for(lambda: em.state.jobs[parent].progress_posts >= 3, 30.0, "a progress post a piece")


@pytest.mark.e2e
def test_a_cancelled_piece_is_run_again_and_a_twice_failed_one_names_itself(endpoint) -> None:
    em = endpoint
    job = {**long_job(60), "output": ["text"]}
    parent = em.submit({**job, "split": 2})
    # Someone else cancels the first piece once: the job submits it again and completes.
    first = wait_for(lambda: next(iter(_children(em, parent)), None), JOB_S, "a piece")
    em.cancel(first.id)
    status = em.wait_job(parent, JOB_S)
    assert status["status"] == "COMPLETED", status
    assert sorted(p["tries"] for p in status["output"]["pieces"]) == [1, 2]

    parent = em.submit({**job, "split": 2})
    stop = threading.Event()

    def cancel_every_piece() -> None:
        while not stop.is_set():
            for child in _children(em, parent):
                if child.status in ("IN_QUEUE", "IN_PROGRESS"):
                    em.cancel(child.id)
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_every_piece, daemon=True)
    canceller.start()
    try:
        status = em.wait_job(parent, JOB_S)
    finally:
        stop.set()
        canceller.join(5)
    assert status["status"] == "FAILED", status
    assert "PIECE_FAILED" in str(status) and "failed 2 times" in str(status), status


@pytest.mark.e2e
def test_cancelling_a_split_job_cancels_its_pieces(endpoint) -> None:
    em = endpoint
    parent = em.submit({**long_job(120), "split": 4, "batch_size": 1})
    wait_for(lambda: len(_children(em, parent)) == 4, JOB_S, "the pieces")
    em.cancel(parent)
    wait_for(
        lambda: all(c.status not in ("IN_QUEUE", "IN_PROGRESS") for c in _children(em, parent)),
        JOB_S,
        "every piece to end",
    )
    assert any(c.status == "CANCELLED" for c in _children(em, parent))


@pytest.mark.e2e
def test_the_client_splits_from_the_command_line(endpoint, tmp_path, monkeypatch, capsys) -> None:
    """`python -m whisper_client FILE --split 2`: the caller's way in."""
    from speech_assets.clips import wav_bytes
    from whisper_client.client import main

    em = endpoint
    path = tmp_path / "long.wav"
    clip = long_clip(50)
    path.write_bytes(wav_bytes(clip.samples))
    monkeypatch.setenv("RUNPOD_API_KEY", em.api_key)
    args = [
        str(path),
        "--endpoint",
        em.config.endpoint_id,
        "--base-url",
        em.base_url,
        "--split",
        "2",
        "--output",
        "json",
    ]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert [p["piece"] for p in result["pieces"]] == [1, 2]
    assert wer(clip.text, result["text"]) <= 0.15


@pytest.mark.e2e
def test_speakers_are_one_set_across_the_pieces(endpoint) -> None:
    """With diarize the job's own worker diarizes the whole recording while the pieces are
    transcribed, so "A" is one person throughout and a given count holds for the whole.
    Three real voices take turns twice over; cut in two, the second half starts
    with another voice (a piece diarized alone would call it "A"); cut in five pieces of
    about 12 s, with num_speakers=3, some piece holds one or two voices only (matching
    each piece's own speakers by their embeddings found 1 of 2 speakers on the bench's
    1-minute conversation cut in three)."""
    from faster_whisper import decode_audio

    from speech_assets.clips import DATA, read_wav, wav_bytes
    from speech_assets.diarization import attribution, join_turns, pyannote_sample

    rate = 16000
    phone = decode_audio(str(pyannote_sample()[0]))
    libri = [read_wav(p) for p in sorted((DATA / "librivox").glob("*.wav"))]
    jfk = read_wav(DATA / "jfk.wav")
    calls = [
        phone[int(10.6 * rate) : int(14.45 * rate)],
        phone[int(18.1 * rate) : int(21.4 * rate)],
    ]
    order = [
        ("jfk", jfk[: 5 * rate]),
        ("reader", libri[0]),
        ("phone", calls[0]),
        ("jfk", jfk[5 * rate :]),
        ("reader", libri[1]),
        ("phone", calls[1]),
        ("reader", libri[2]),
        ("jfk", jfk[: 5 * rate]),
        ("phone", calls[0]),
        ("reader", libri[3]),
    ]
    audio, ref = join_turns(order, gap_s=1.2)
    em = endpoint
    base = {
        "audio_base64": base64.b64encode(wav_bytes(audio)).decode(),
        "diarize": True,
        "output": ["segments", "rttm", "diarized_json"],
    }
    unsplit = em.wait_job(em.submit(base), JOB_S)
    assert unsplit["status"] == "COMPLETED", unsplit
    hyp0 = [(s["start"], s["end"], s["speaker"]) for s in unsplit["output"]["segments"]]
    for extra in ({"split": 2}, {"split": 5, "num_speakers": 3}):
        status = em.wait_job(em.submit({**base, **extra}), JOB_S)
        assert status["status"] == "COMPLETED", status
        out = status["output"]
        assert len(out["pieces"]) == extra["split"]
        assert {s["speaker"] for s in out["speakers"]} == {"A", "B", "C"}, out["speakers"]
        # The speaker turns (RTTM) are the whole recording's: as right as unsplit.
        turns = [
            (float(f[3]), float(f[3]) + float(f[4]), f[7])
            for f in (line.split() for line in out["rttm"].splitlines())
        ]
        assert attribution(ref, turns) >= max(0.95, attribution(ref, hyp0) - 0.02), extra
        # Every segment carries its speaker (a 9-s piece may lose a phrase's words: only
        # the reference turns the pieces transcribed are scored here).
        hyp = [(s["start"], s["end"], s["speaker"]) for s in out["segments"]]
        said = [r for r in ref if any(min(r[1], h[1]) > max(r[0], h[0]) for h in hyp)]
        assert len(said) >= len(ref) - 1 and attribution(said, hyp) >= 0.95, extra
        second = out["pieces"][1]["start"]
        late = [s for s in out["segments"] if s["start"] >= second]
        assert late and late[0]["speaker"] != "A"  # the caller or the reader, never JFK
        assert out["rttm"].count("SPEAKER") >= 6
        assert all(w.get("speaker") for s in out["segments"] for w in s.get("words") or [])
    # The pieces embedded their windows (the costly half of diarizing) and the whole
    # clustered them: each piece's output carries its windows, not speakers of its own.
    with em.state.cond:
        last = max(
            (j for j in em.state.jobs.values() if "split" in (j.input or {})),
            key=lambda j: j.submitted_at,
        )
        kids = [em.state.jobs[p["job_id"]] for p in last.output["pieces"]]
    assert all(k.input.get("speaker_windows") and "num_speakers" not in k.input for k in kids)
    assert all(k.output["speaker_windows"]["spans"] and not k.output["speakers"] for k in kids)


@pytest.fixture(scope="module")
def one_job_workers(tmp_path_factory) -> Any:
    """Two real workers that each hold one job at a time, pieces through S3 (moto's server
    on 127.0.0.1): a split job's parent holds its worker, so at most one piece runs
    elsewhere; the piece bucket takes every piece (inline limit 0)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logs = tmp_path_factory.mktemp("fanout-s3")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    aws = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket="pieces")
    s3.create_bucket(Bucket="uploads")
    em = Emulator(ping_interval_ms=1000, stop_grace_s=30.0, log_dir=str(logs)).start()
    try:
        env = {
            "WHISPER_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "RUNPOD_API_KEY": em.api_key,
            "WHISPER_MODEL": "tiny.en",
            "WHISPER_MAX_CONCURRENCY": "1",
            "TMPDIR": str(logs),
            "WHISPER_S3_ENDPOINT_URL": f"http://{host}:{port}",
            "WHISPER_S3_ALLOWED_BUCKETS": "pieces",
            "WHISPER_PIECE_BUCKET": "pieces",
            "WHISPER_PIECE_INLINE_BYTES": "0",
            "WHISPER_PIECE_QUEUE_WAIT_S": "3",
            "WHISPER_ALLOW_PRIVATE_URLS": "true",
            **aws,
        }
        wids = [
            em.start_worker(env, command=[sys.executable, "-m", "handler"], cwd=str(ROOT))
            for _ in range(2)
        ]
        for wid in wids:
            em.wait_worker(wid, {"idle", "busy"}, READY_S)
        yield em, s3, f"http://{host}:{port}"
    finally:
        em.stop()
        server.stop()


@pytest.mark.e2e
def test_large_pieces_travel_through_the_piece_bucket_and_are_deleted(one_job_workers) -> None:
    """Pieces over the inline limit go to WHISPER_PIECE_BUCKET as s3:// objects that the
    pieces' workers read; none is left when the job ends. The piece that no worker can take
    (the other worker is busy with one piece, this one with the parent) is run by the
    parent's worker after the queue wait."""
    em, s3, _ = one_job_workers
    clip = long_clip(60)
    parent = em.submit({**long_job(60), "split": 3, "output": ["text"]})
    status = em.wait_job(parent, JOB_S)
    assert status["status"] == "COMPLETED", status
    out = status["output"]
    assert wer(clip.text, out["text"]) <= 0.15
    kids = _children(em, parent)
    urls = [c.input.get("audio_url", "") for c in kids]
    assert urls and all(u.startswith("s3://pieces/pieces/") for u in urls), urls
    # Each piece carries its parent's seal: the digest of the piece as cut, signed.
    assert all(set(c.input["piece"]) == {"sha256", "expires", "sig"} for c in kids)
    assert any(not p["ran_here"] for p in out["pieces"])  # read from S3 by the other worker
    assert s3.list_objects_v2(Bucket="pieces").get("KeyCount") == 0


@pytest.mark.e2e
def test_split_jobs_holding_every_worker_run_their_own_pieces(one_job_workers) -> None:
    """Two split jobs at once on two one-job workers: both workers hold a parent, so no
    piece can ever be taken from the queue. Each parent takes its pieces back after the
    queue wait and runs them itself; without that both would wait forever."""
    em, s3, _ = one_job_workers
    job = {**long_job(40), "split": 2, "output": ["text"]}
    parents = [em.submit(job), em.submit(job)]
    for parent in parents:
        status = em.wait_job(parent, JOB_S)
        assert status["status"] == "COMPLETED", status
        assert [p["ran_here"] for p in status["output"]["pieces"]] == [True, True]
        assert all(p["job_id"] is None for p in status["output"]["pieces"])
    # Once both have ended: every piece either submitted was cancelled in the queue. (Checked
    # after the loop: the first parent's "children" include the second's pieces, which may
    # still wait out their queue time when the first parent ends.)
    kids = _children(em, parents[0])
    assert len(kids) == 4 and all(c.status == "CANCELLED" for c in kids), kids
    assert s3.list_objects_v2(Bucket="pieces").get("KeyCount") == 0


def test_a_piece_bucket_the_pieces_cannot_read_is_refused_at_start() -> None:
    from handler.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="WHISPER_S3_ALLOWED_BUCKETS") as err:
        load_settings({"WHISPER_PIECE_BUCKET": "pieces", "WHISPER_S3_ALLOWED_BUCKETS": "in"})
    assert "WHISPER_: " not in str(err.value)
    assert load_settings({"WHISPER_PIECE_BUCKET": "p", "WHISPER_S3_ALLOWED_BUCKETS": "in,p"})


@pytest.mark.e2e
def test_the_client_sends_a_local_file_through_the_callers_bucket(
    one_job_workers, tmp_path, monkeypatch, capsys
) -> None:
    """`--upload-to s3://bucket/prefix/`: a local file (a long one is over the 10-MB inline
    limit) goes to the caller's bucket, the job gets a presigned URL, the object is deleted
    when the job ends (the recording is fetched once, nothing left behind)."""
    from speech_assets.clips import wav_bytes
    from whisper_client.client import main

    em, s3, url = one_job_workers
    path = tmp_path / "call.wav"
    clip = long_clip(40)
    path.write_bytes(wav_bytes(clip.samples))
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
        "RUNPOD_API_KEY": em.api_key,
    }.items():
        monkeypatch.setenv(key, value)
    args = [
        str(path),
        "--endpoint",
        em.config.endpoint_id,
        "--base-url",
        em.base_url,
        "--upload-to",
        "s3://uploads/calls/",
        "--split",
        "2",
        "--output",
        "json",
    ]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert wer(clip.text, result["text"]) <= 0.15 and len(result["pieces"]) == 2
    with em.state.cond:
        sent = [j.input for j in em.state.jobs.values() if "split" in (j.input or {})][-1]
    assert sent["audio_url"].startswith(f"{url}/uploads/calls/") and "audio_base64" not in sent
    assert "X-Amz-Signature=" in sent["audio_url"]
    assert s3.list_objects_v2(Bucket="uploads").get("KeyCount") == 0


def test_a_piece_result_over_the_size_limit_is_read_back(one_job_workers) -> None:
    """A piece whose result was over the platform's size limit answers a summary and a
    presigned URL (output/offload); the waiting worker reads the whole back from it, and a
    URL that does not answer counts as a failed piece (submitted again), never a hole."""
    from handler.faces.fanout import Platform

    em, s3, url = one_job_workers
    full = {"text": "ask not", "segments": [{"id": 1, "start": 0.0, "end": 1.0}]}
    s3.put_object(Bucket="pieces", Key="results/piece.json", Body=json.dumps(full).encode())
    try:
        link = s3.generate_presigned_url(
            "get_object", Params={"Bucket": "pieces", "Key": "results/piece.json"}, ExpiresIn=60
        )
        own = make_settings(s3_endpoint_url=url)
        platform = Platform(em.base_url, em.config.endpoint_id, em.api_key, settings=own)
        assert platform._whole({"result_url": link, "language": "en"}) == full
        gone = link.replace("piece.json", "other.json")
        assert platform._whole({"result_url": gone, "language": "en"}) is None
        assert platform._whole({"text": "inline"}) == {"text": "inline"}
    finally:
        s3.delete_object(Bucket="pieces", Key="results/piece.json")


def test_a_piece_results_url_goes_through_the_audio_url_guard(one_job_workers) -> None:
    """The probe: the parent fetched a piece's result_url on a loopback address. Only the
    deployment's own S3 endpoint may be private; any other private address is refused (a
    failed piece: submitted again, then PIECE_FAILED), as an audio URL would be."""
    from handler.faces.fanout import Platform
    from tests.httpserver import LocalServer, respond

    em, _, url = one_job_workers
    body = json.dumps({"text": "from an internal service"}).encode()
    with LocalServer() as inside:
        inside.route("/result.json", lambda h: respond(h, 200, body))
        own = make_settings(s3_endpoint_url=url)
        platform = Platform(em.base_url, em.config.endpoint_id, em.api_key, settings=own)
        assert platform._whole({"result_url": inside.url("/result.json")}) is None
        assert inside.hits["/result.json"] == 0  # refused before any request was made
        opened = make_settings(allow_private_urls="true")
        lax = Platform(em.base_url, em.config.endpoint_id, em.api_key, settings=opened)
        assert lax._whole({"result_url": inside.url("/result.json")}) == json.loads(body)


def _sealed_job(s3: Any, key: str, audio: bytes, secret: str) -> dict[str, Any]:
    from handler.audio.seal import seal

    url = f"s3://pieces/{key}"
    s3.put_object(Bucket="pieces", Key=key, Body=audio)
    return {"audio_url": url, "piece": seal(url, audio, 600, secret.encode())}


def test_only_sealed_unchanged_pieces_are_read_from_the_piece_bucket(
    one_job_workers, tiny_pool, monkeypatch
) -> None:
    """The probe: any job could read any object of the piece bucket by its key, and a
    piece overwritten while its job ran was stitched in unchecked."""
    from handler.pipeline.runtime import Runtime

    _, s3, url = one_job_workers
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    secret = "s" * 32
    settings = make_settings(
        device="cpu",
        s3_endpoint_url=url,
        s3_allowed_buckets="pieces",
        piece_bucket="pieces",
        piece_secret=secret,
    )
    worker = Runtime(settings=settings, pool=tiny_pool)
    jfk = (DATA / "jfk.wav").read_bytes()
    try:
        good = _sealed_job(s3, "pieces/a/1.flac", jfk, secret)
        assert wer(JFK_TEXT, run_job(good, worker)["text"]) < 0.2
        no_seal = run_job({"audio_url": good["audio_url"]}, worker)
        assert no_seal["error_code"] == "URL_NOT_ALLOWED" and not no_seal["retryable"]
        forged = {**good, "piece": {**good["piece"], "sig": "0" * 64}}
        assert run_job(forged, worker)["error_code"] == "URL_NOT_ALLOWED"
        other_key = {**good, "audio_url": "s3://pieces/pieces/b/1.flac"}
        assert run_job(other_key, worker)["error_code"] == "URL_NOT_ALLOWED"
        wrong_secret = _sealed_job(s3, "pieces/c/1.flac", jfk, "t" * 32)
        assert run_job(wrong_secret, worker)["error_code"] == "URL_NOT_ALLOWED"
        # Overwritten after the seal: the bytes no longer match the digest.
        s3.put_object(Bucket="pieces", Key="pieces/a/1.flac", Body=jfk[:-1000])
        changed = run_job(good, worker)
        assert changed["error_code"] == "INVALID_INPUT" and "changed" in changed["error"]
    finally:
        for key in ("pieces/a/1.flac", "pieces/c/1.flac"):
            s3.delete_object(Bucket="pieces", Key=key)
