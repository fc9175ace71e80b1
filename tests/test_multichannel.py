"""``multichannel``: each channel of a recording transcribed on its own, on the real tiny.en
model and a two-channel call built from real speech (tests/media.py: write_call_wav).

The faces' own shapes of it (OpenAI's, Deepgram's, AssemblyAI's) are tested through their
clients in test_http, test_deepgram and test_assemblyai."""

from __future__ import annotations

import io
import pathlib
import wave

import av
import faster_whisper
import numpy as np
import pytest
import srt
from hypothesis import given, settings
from hypothesis import strategies as st

from handler.audio.decode import decode_audio, decode_bytes
from handler.contract import MAX_CHANNELS
from handler.errors import Code, WorkerError
from handler.pipeline.job import run_job
from handler.settings import Settings
from tests.helpers import DATA, JFK_TEXT, b64, make_settings, wer
from tests.media import CALL_TEXTS, write_call_wav, write_pcm

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def call_wav(tmp_path_factory) -> pathlib.Path:
    return write_call_wav(tmp_path_factory.mktemp("call") / "call.wav")


def test_each_channel_is_heard_alone_and_the_turns_come_in_time_order(worker, call_wav, no_leaks):
    streamed: list[dict] = []
    progress: list[float] = []
    job = {"audio_base64": b64(call_wav), "multichannel": True, "output": ["text", "segments"]}
    result = run_job(job, worker, on_segment=streamed.append, on_progress=progress.append)
    assert "error" not in result, result
    chans = result["channels"]
    assert [c["channel"] for c in chans] == [0, 1]
    for c, expected in zip(chans, CALL_TEXTS, strict=True):
        assert wer(expected, c["text"]) <= 0.3, c
        assert c["language"] == "en" and "same_as" not in c
    # The call's turns: channel 0, then 1 (3.5 s), then 0 again (9.3 s), each segment
    # timed inside its own speech.
    segs = result["segments"]
    assert [s["channel"] for s in segs] == [0, 1, 0], segs
    assert [s["id"] for s in segs] == [0, 1, 2]
    assert segs[1]["start"] == pytest.approx(3.5, abs=0.6)
    assert segs[2]["start"] == pytest.approx(9.3, abs=0.6)
    assert result["text"].split(".")[1].strip().lower().startswith("unless")
    assert sorted(s["channel"] for s in streamed) == [0, 0, 1]
    assert progress == sorted(progress) and all(0 <= p <= 100 for p in progress)
    # Two transcriptions' seconds, one decode.
    assert result["timings"]["transcribe"] > 0 and len(result.get("batch_sizes", [])) >= 2


def test_words_and_subtitles_carry_their_channel(worker, call_wav, no_leaks):
    job = {
        "audio_base64": b64(call_wav),
        "multichannel": True,
        "output": ["words", "srt", "vtt"],
        "word_timestamps": True,
    }
    result = run_job(job, worker)
    assert "error" not in result, result
    by_channel = {0: [], 1: []}
    for w in result["words"]:
        by_channel[w["channel"]].append(w)
    assert by_channel[0] and by_channel[1]
    assert all(3.0 <= w["start"] <= 9.5 for w in by_channel[1])
    cues = list(srt.parse(result["srt"]))
    labels = [c.content.split("]")[0] + "]" for c in cues]
    assert set(labels) == {"[channel 0]", "[channel 1]"}, labels
    assert "<v channel 1>" in result["vtt"]


def test_a_channel_that_repeats_another_is_transcribed_once(worker, tmp_path, no_leaks):
    path = write_call_wav(tmp_path / "same.wav", same=True)
    result = run_job({"audio_base64": b64(path), "multichannel": True}, worker)
    assert "error" not in result, result
    first, second = result["channels"]
    assert second["same_as"] == 0 and second["text"] == first["text"]
    assert {s["channel"] for s in result["segments"]} == {0}
    assert any("channel 1 carries the same audio as channel 0" in w for w in result["warnings"])


def test_a_mono_file_is_one_channel(worker, no_leaks):
    result = run_job({"audio_base64": b64(DATA / "jfk.wav"), "multichannel": True}, worker)
    assert "error" not in result, result
    assert [c["channel"] for c in result["channels"]] == [0]
    assert {s["channel"] for s in result["segments"]} == {0}


def test_unset_the_channels_are_mixed_down_as_before(worker, call_wav, no_leaks):
    result = run_job({"audio_base64": b64(call_wav)}, worker)
    assert "error" not in result, result
    assert "channels" not in result and all("channel" not in s for s in result["segments"])
    assert wer(" ".join(CALL_TEXTS), result["text"]) <= 0.6


@pytest.mark.parametrize(
    "extra,needle",
    [({"split": 2}, "split"), ({"multichannel": "yes"}, "")],
)
def test_what_does_not_combine_is_refused_before_any_work(worker, call_wav, extra, needle):
    job = {"audio_base64": b64(call_wav), "multichannel": True, **extra}
    result = run_job(job, worker)
    assert result["error_code"] == "INVALID_INPUT" and result["retryable"] is False
    assert needle in result["error"]


def test_too_many_channels_or_channel_seconds_are_refused(worker, tmp_path, no_leaks):
    many = write_pcm(tmp_path / "many.wav", np.zeros((16000, MAX_CHANNELS + 1), np.int16))
    result = run_job({"audio_base64": b64(many), "multichannel": True}, worker)
    assert result["error_code"] == "INVALID_INPUT", result
    assert f"{MAX_CHANNELS} at most" in result["error"]
    assert "error" not in run_job({"audio_base64": b64(many)}, worker)  # mixed down: served
    # The length cap counts every channel: 2 x 13 s is over 20 s, one 13-s mix is not.
    from handler.pipeline.runtime import Runtime

    capped = Runtime(settings=make_settings(device="cpu", max_audio_seconds=20), pool=worker.pool)
    call = write_call_wav(tmp_path / "call.wav")
    result = run_job({"audio_base64": b64(call), "multichannel": True}, capped)
    assert result["error_code"] == "AUDIO_TOO_LONG" and "2 channels" in result["error"]
    assert "error" not in run_job({"audio_base64": b64(call)}, capped)


@pytest.mark.parametrize("count", [6, 12])
def test_unnamed_microphones_are_mixed_down_without_losing_one(worker, tmp_path, count, no_leaks):
    # A WAV of N microphones has no channel names. FFmpeg guessed 5.1 for six (the fourth,
    # taken for LFE, dropped) and nothing for twelve: JFK on that one came out silent, an
    # empty transcript with no error. Each channel now counts the same.
    with wave.open(str(DATA / "jfk.wav")) as w:
        speech = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    pcm = np.zeros((len(speech), count), np.int16)
    pcm[:, 3] = speech
    path = write_pcm(tmp_path / "mics.wav", pcm)
    result = run_job({"audio_base64": b64(path)}, worker)
    assert "error" not in result, result
    assert wer(JFK_TEXT, result["text"]) <= 0.1, result["text"]


def test_the_channels_waiting_their_turn_count_in_the_memory_budget(worker, tmp_path, no_leaks):
    from handler.pipeline.runtime import Runtime
    from tests.media import encode_silence

    # Four channels of 300 s: each channel's transcription is estimated at about 115 MB
    # and the three others' samples, held meanwhile, at 58 MB: 173 MB, over a 150 MiB
    # budget (157 MB), which the same file mixed down (115 MB) fits.
    path = tmp_path / "quad.flac"
    path.write_bytes(encode_silence("flac", "flac", 300, rate=16000, layout="quad"))
    small = Runtime(settings=make_settings(device="cpu", memory_budget_mb=150), pool=worker.pool)
    mixed = run_job({"audio_base64": b64(path)}, small)
    assert "error" not in mixed, mixed
    split = run_job({"audio_base64": b64(path), "multichannel": True}, small)
    assert split["error_code"] == "MEMORY_BUDGET_EXCEEDED", split
    assert small.memory_budget().used == 0


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, MAX_CHANNELS + 4),
    rate=st.sampled_from([8000, 11025, 16000, 44100, 48000]),
    frames=st.integers(0, 4000),
    split=st.booleans(),
)
def test_any_channel_count_decodes_or_is_refused_with_a_code(count, rate, frames, split):
    """Any WAV of 1-20 channels at any common rate, mixed down or split: the samples (a
    row per channel when split), or a WorkerError with its code; never a crash (PyAV 18
    segfaulted reading 8 or more planar channels) or another exception."""
    noise = np.random.default_rng(count * frames).integers(-3000, 3000, (frames, count))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(count)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(noise.astype(np.int16).tobytes())
    try:
        got = decode_bytes(buf.getvalue(), Settings(), split_channels=split)
    except WorkerError as exc:
        assert exc.code in (Code.EMPTY_AUDIO, Code.INVALID_INPUT), exc
        # Nothing out of the resampler for a few frames; too many channels to split.
        assert (exc.code is Code.EMPTY_AUDIO and frames < 100) or (split and count > 16)
        return
    assert frames > 0 and not (split and count > MAX_CHANNELS)
    if split:
        assert got.channels is not None and len(got.channels) == count
        assert len({len(c) for c in got.channels}) == 1
    else:
        assert got.channels is None
        assert frames < 100 or np.abs(got.samples).max() > 0


def test_split_channels_are_faster_whispers_split_stereo_exactly(tmp_path):
    path = write_call_wav(tmp_path / "call44.wav", rate=44100)
    left, right = faster_whisper.decode_audio(str(path), split_stereo=True)
    got = decode_audio(path, Settings(), split_channels=True)
    assert got.channels is not None and len(got.channels) == 2
    np.testing.assert_array_equal(got.channels[0], left)
    np.testing.assert_array_equal(got.channels[1], right)
    assert got.samples is got.channels[0] and got.duration == pytest.approx(13.0, abs=0.01)


def test_a_stream_whose_layout_changes_keeps_the_first_layout(tmp_path):
    # Two MP3s back to back, stereo then mono (a concatenated upload): the mono half is
    # spread over both channels, never read as a different number of channels.
    def mp3(layout: str, seconds: float) -> bytes:
        buf = io.BytesIO()
        with av.open(buf, "w", format="mp3") as out:
            stream = out.add_stream("libmp3lame", rate=16000, layout=layout)
            n = round(seconds * 16000)
            channels = 2 if layout == "stereo" else 1
            tone = (0.3 * np.sin(np.arange(n) * 0.1) * 32767).astype(np.int16)
            frame = av.AudioFrame.from_ndarray(
                np.tile(tone, (1, channels)).reshape(1, -1), format="s16", layout=layout
            )
            frame.sample_rate = 16000
            for packet in stream.encode(frame):
                out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        return buf.getvalue()

    path = tmp_path / "joined.mp3"
    path.write_bytes(mp3("stereo", 2.0) + mp3("mono", 2.0))
    got = decode_audio(path, Settings(), split_channels=True)
    assert got.channels is not None and len(got.channels) == 2
    assert len(got.channels[0]) == len(got.channels[1])
    with pytest.raises(WorkerError) as info:
        decode_audio(path, Settings(max_audio_seconds=3.0), split_channels=True)
    assert info.value.code is Code.AUDIO_TOO_LONG


def _seg(channel: int, *words: tuple[float, float, str]) -> dict:
    ws = [{"start": a, "end": b, "word": f" {t}", "probability": 0.9} for a, b, t in words]
    return {
        "id": 0, "seek": 0, "start": ws[0]["start"], "end": ws[-1]["end"],
        "text": "".join(w["word"] for w in ws), "tokens": [1, 2], "temperature": 0.0,
        "avg_logprob": -0.2, "compression_ratio": 1.0, "no_speech_prob": 0.0,
        "words": ws, "channel": channel,
    }  # fmt: skip


def test_a_segment_is_cut_where_the_other_side_speaks_in_its_pause() -> None:
    from handler.inference.transcribe import Transcript
    from handler.pipeline.channels import merge

    # Side 0 says "hello there" (0-2 s) and, after a pause, "goodbye" (5-6 s) in one
    # segment; side 1 answers "hi" at 3 s, in that pause, and "yes" at 1.5 s, over a word.
    # Then side 1 starts "well" at 7.05 s, over the 0.1-s gap in side 0's "see you".
    left = Transcript(
        [_seg(0, (0, 1, "hello"), (1, 2, "there"), (5, 6, "goodbye"), (6.5, 7, "see"),
              (7.1, 7.4, "you"))], "en", 1, 1
    )  # fmt: skip
    right = Transcript(
        [_seg(1, (1.5, 1.8, "yes")), _seg(1, (3, 4, "hi")), _seg(1, (7.05, 7.6, "well"))],
        "en", 1, 1,
    )  # fmt: skip
    merged = merge([left, right])
    said = [(s["channel"], s["text"].strip()) for s in merged.segments]
    assert said == [(0, "hello there"), (1, "yes"), (1, "hi"), (0, "goodbye see you"), (1, "well")]
    assert [s["id"] for s in merged.segments] == [0, 1, 2, 3, 4]
    cut = merged.segments[3]
    assert cut["start"] == 5 and cut["tokens"] == [] and cut["words"][0]["word"] == " goodbye"
    assert merged.segments[1]["tokens"] == [1, 2]  # a segment not cut keeps its tokens


def test_each_channel_is_let_go_after_its_turn_and_the_rest_are_reserved(worker) -> None:
    """At channel i's turn the channels before it are freed (the decoder's buffers held
    every channel until the job ended: the first one through ``samples``), and its
    reservation counts exactly the samples still waiting."""
    import gc
    import weakref

    from handler.audio.decode import DecodedAudio
    from handler.inference.transcribe import Transcript
    from handler.pipeline import channels
    from handler.pipeline.runtime import Call, Plan

    arrays = [np.full(16000 * (n + 1), n + 1, np.float32) for n in range(3)]
    alive = [weakref.ref(a) for a in arrays]
    audio = DecodedAudio(arrays[0], 1.0, None, "wav", channels=arrays)
    del arrays
    seen = []

    def one(plan, part, runtime, call):
        gc.collect()
        seen.append(([r() is not None for r in alive], call.held_bytes, len(part.samples)))
        return Transcript([_seg(0, (0, 1, "hi"))], "en", 1.0, 0.1)

    plan = Plan(None, None, {}, None, 1)  # type: ignore[arg-type]
    channels.run(plan, audio, worker, Call(), one)
    assert seen == [
        ([True, True, True], 4 * (32000 + 48000), 16000),
        ([False, True, True], 4 * 48000, 32000),
        ([False, False, True], 0, 48000),
    ]
