"""AssemblyAI's pre-recorded API (``/v2/upload``, ``/v2/transcript``), through AssemblyAI's own
Python SDK (1.8.2) pointed at ``python -m handler serve`` with the real tiny.en model, as a
user moving off AssemblyAI would run it: only ``base_url`` and the key change. Through a
gateway and its consumer on a real Redis: tests/test_broker.py; speakers:
tests/test_diarization.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from handler.faces.assemblyai import request as aai_request
from handler.faces.assemblyai import shape
from tests.helpers import DATA, JFK_TEXT, wer
from tests.test_http import Server
from tests.voice import livekit_events, no_error_logged, pcm16, pipecat_turns, until

KEY = "assemblyai-test-key-0123456789abcdef"


def _word(text: str, start: float, end: float, speaker: str | None = None) -> dict[str, Any]:
    w = {"word": " " + text, "start": start, "end": end, "probability": 0.9}
    return {**w, "speaker": speaker} if speaker else w


def test_sentences_paragraphs_and_speakers_are_assemblyais_shapes() -> None:
    """Words in milliseconds, speakers lettered by first word, sentences cut after their
    end mark and where the speaker changes, paragraphs at a long pause or another speaker."""
    result = {
        "text": "Hello there. How are you? Fine.",
        "words": [
            _word("Hello", 0.0, 0.4, "SPEAKER_01"),
            _word("there.", 0.4, 0.8, "SPEAKER_01"),
            _word("How", 1.0, 1.2, "SPEAKER_01"),
            _word("are", 1.2, 1.4, "SPEAKER_00"),
            _word("you?", 1.4, 1.8, "SPEAKER_00"),
            _word("Fine.", 4.0, 4.5, "SPEAKER_00"),
        ],
        "duration": 5.4,
        "language": "en",
    }
    out = shape.completed(result, {"speaker_labels": True})
    assert [w["speaker"] for w in out["words"]] == ["A", "A", "A", "B", "B", "B"]
    assert out["words"][1] == {
        "text": "there.",
        "start": 400,
        "end": 800,
        "confidence": 0.9,
        "speaker": "A",
    }
    assert out["audio_duration"] == 5 and [u["speaker"] for u in out["utterances"]] == ["A", "B"]
    assert [s["text"] for s in shape.sentences(out["words"])] == [
        "Hello there.",
        "How",
        "are you?",
        "Fine.",
    ]
    paragraphs = shape.paragraphs(out["words"])
    assert [p["text"] for p in paragraphs] == ["Hello there. How", "are you?", "Fine."]
    spelled = shape.completed(result, {"custom_spelling": [{"from": ["fine"], "to": "FINE"}]})
    assert spelled["text"].endswith("FINE.") and spelled["words"][-1]["text"] == "FINE."


@settings(max_examples=200, deadline=None)
@given(
    spoken=st.lists(st.sampled_from(["a", "b", "c", "ask", "not"]), max_size=60),
    terms=st.lists(
        st.lists(st.sampled_from(["a", "b", "c", "ask", "not", "zz"]), min_size=1, max_size=5),
        max_size=8,
    ),
)
def test_phrase_search_finds_what_a_scan_of_every_position_finds(spoken, terms) -> None:
    """The search both faces answer looks only where a term's first word is (a 100-term
    query on a 4-hour transcript was 100 scans of 40,000 words on the event loop): it
    finds exactly the starts a scan of every position finds."""
    from handler.output.sentences import find_phrases

    scan = [
        [i for i in range(len(spoken) - len(t) + 1) if spoken[i : i + len(t)] == t] for t in terms
    ]
    assert find_phrases(spoken, terms) == scan


def test_a_request_becomes_a_job_and_what_cannot_be_served_is_refused() -> None:
    job, echo = aai_request.job_for(
        {
            "audio_url": "https://example.com/a.mp3",
            "language_code": "en_us",
            "speaker_labels": True,
            "speakers_expected": 2,
            "word_boost": ["Kubernetes"],
            "keyterms_prompt": ["KEDA"],
            "audio_start_from": 1500,
            "audio_end_at": 9000,
            "punctuate": True,
            "speech_model": "tiny.en",
        },
        ["tiny.en"],
    )
    assert job["language"] == "en" and job["diarize"] is True and job["num_speakers"] == 2
    assert job["hotwords"] == "Kubernetes, KEDA" and job["clip_timestamps"] == [1.5, 9.0]
    assert job["model"] == "tiny.en" and echo["audio_url"] == "https://example.com/a.mp3"
    detect, _ = aai_request.job_for(
        {"audio_url": "u", "language_detection": True, "language_codes": ["en", "es"]}, []
    )
    assert "language" not in detect and detect["languages"] == ["en", "es"]
    refusals = {
        "summarization": "summaries",
        "redact_pii": "redact_pii_policies",  # numbers are served (tests/test_redact.py)
        "redact_pii_audio": "PII redaction of the audio",
        "no_such_option": "not an option",
    }
    for name, said in refusals.items():
        with pytest.raises(aai_request.Refused, match=said):
            aai_request.job_for({"audio_url": "u", name: True}, [])
    for name in ("multichannel", "dual_channel"):
        channels, echo = aai_request.job_for({"audio_url": "u", name: True}, [])
        assert channels["multichannel"] is True and echo[name] is True
        with pytest.raises(aai_request.Refused, match="speaker_labels"):
            aai_request.job_for({"audio_url": "u", name: True, "speaker_labels": True}, [])
    for bad in (
        {"audio_url": ""},
        {"audio_url": "u", "multichannel": "yes"},
        {"audio_url": "u", "speakers_expected": 2},
        {"audio_url": "u", "speaker_labels": "yes"},
        {"audio_url": "u", "audio_start_from": 5000, "audio_end_at": 1000},
        {"audio_url": "u", "word_boost": ["x" * 101]},
        {"audio_url": "u", "custom_spelling": [{"from": "a", "to": "b"}]},
        {"audio_url": "u", "temperature": 3},
        {"audio_url": "u", "custom_spelling": [{"from": ["w" * 99] * 100, "to": "x"}] * 10},
        ["not", "an", "object"],
    ):
        with pytest.raises(aai_request.Refused):
            aai_request.job_for(bad, [])


def test_a_webhook_is_checked_and_becomes_assemblyais_call() -> None:
    hook = aai_request.webhook_of(
        {
            "webhook_url": "https://example.com/hook",
            "webhook_auth_header_name": "X-Secret",
            "webhook_auth_header_value": "s3cret",
        }
    )
    assert hook is not None and json.loads(hook) == {
        "url": "https://example.com/hook",
        "shape": "assemblyai",
        "headers": {"X-Secret": "s3cret"},
    }
    assert aai_request.webhook_of({}) is None
    with pytest.raises(aai_request.Refused) as named:
        aai_request.webhook_of({"webhook_url": "http://[::1"})
    assert str(named.value).startswith("webhook_url") and "audio_url" not in str(named.value)
    for bad, said in (
        ({"webhook_url": "gopher://example.com/"}, "webhook_url"),
        ({"webhook_url": "file:///etc/passwd"}, "webhook_url"),
        ({"webhook_url": "https://e.com", "webhook_auth_header_name": "X-A"}, "both"),
        (
            {
                "webhook_url": "https://e.com",
                "webhook_auth_header_name": "Host",
                "webhook_auth_header_value": "x",
            },
            "set by the worker",
        ),
        (
            {
                "webhook_url": "https://e.com",
                "webhook_auth_header_name": "X-A",
                "webhook_auth_header_value": "a\r\nX-B: b",
            },
            "one line",
        ),
    ):
        with pytest.raises(aai_request.Refused, match=said):
            aai_request.webhook_of(bad)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_OPTIONS = sorted(
    set(aai_request.ECHOED) | set(aai_request.NOT_SERVED) | aai_request.TAKEN | {"webhook_url"}
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(_OPTIONS), _JSON, max_size=6)
    | st.dictionaries(st.sampled_from(_OPTIONS), st.text(max_size=30), max_size=6)
    | _JSON
)
def test_any_transcript_request_is_a_job_or_a_refusal(body: Any) -> None:
    """Whatever JSON a caller sends (AssemblyAI's option names with any values): a job and
    its echo, or Refused with a sentence; never another exception (a 500 INTERNAL)."""
    try:
        job, echo = aai_request.job_for(body, ["tiny.en"])
        aai_request.webhook_of(body)
    except aai_request.Refused as exc:
        assert str(exc)
        return
    assert isinstance(job, dict) and isinstance(echo, dict)
    json.dumps(echo)  # kept as JSON beside the job


@settings(max_examples=300, deadline=None)
@given(
    query=st.dictionaries(
        st.sampled_from(
            [
                "sample_rate",
                "encoding",
                "speech_model",
                "language_code",
                "language_codes",
                "language_detection",
                "keyterms_prompt",
                "prompt",
                "format_turns",
                "min_turn_silence",
                "max_turn_silence",
                "end_of_turn_confidence_threshold",
                "vad_threshold",
                "speaker_labels",
                "max_speakers",
                "min_end_of_turn_silence_when_confident",
                "filter_profanity",
            ]
        ),
        st.text(max_size=20),
        max_size=8,
    )
)
def test_any_streaming_query_is_a_session_or_a_refusal(query: dict[str, str]) -> None:
    """The /v3/ws query, any values: a session object the live config takes, or a
    SessionError (an Error message and a 3006 close); never another exception."""
    from handler.faces.assemblyai.live import configure
    from handler.faces.realtime.protocol import SessionError

    try:
        session, options = configure(query, ["tiny.en"])
    except SessionError as exc:
        assert str(exc)
        return
    assert session["type"] == "transcription" and isinstance(options, dict)
    most = session["audio"]["input"]["transcription"].get("max_speakers")
    assert most is None or (type(most) is int and 1 <= most <= 20)


def test_speaker_labels_and_max_speakers_in_the_streaming_query() -> None:
    """``speaker_labels`` asks the session for speakers; ``max_speakers`` is a whole number
    from 1 to 20 (1.5 was taken as 1)."""
    from handler.faces.assemblyai.live import configure
    from handler.faces.realtime.protocol import SessionError

    def transcription(**query: str) -> dict[str, Any]:
        session, _ = configure({"sample_rate": "16000", **query}, ["tiny.en"])
        return session["audio"]["input"]["transcription"]

    assert transcription(speaker_labels="true", max_speakers="3") | {} == {
        **transcription(),
        "diarize": True,
        "max_speakers": 3,
    }
    assert "diarize" not in transcription(speaker_labels="false", max_speakers="3")
    for bad in ("1.5", "0", "21", "many"):
        with pytest.raises(SessionError, match="max_speakers"):
            transcription(speaker_labels="true", max_speakers=bad)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server(
        {
            "WHISPER_API_KEY": KEY,
            "WHISPER_MAX_CONCURRENCY": "2",
            "WHISPER_ALLOW_PRIVATE_URLS": "true",  # the URL test serves audio on 127.0.0.1
        }
    )
    yield srv
    srv.stop()


@pytest.fixture
def aai(server: Server) -> Iterator[Any]:
    import assemblyai

    saved = assemblyai.settings.model_copy()
    assemblyai.settings.base_url = server.url
    assemblyai.settings.api_key = KEY
    assemblyai.settings.polling_interval = 0.2
    yield assemblyai
    for name in ("base_url", "api_key", "polling_interval"):
        setattr(assemblyai.settings, name, getattr(saved, name))


@pytest.fixture
def audio_site() -> Iterator[str]:
    handler = partial(SimpleHTTPRequestHandler, directory=str(DATA))
    site = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}/jfk.wav"
    site.shutdown()
    site.server_close()


@pytest.mark.e2e
def test_the_assemblyai_sdk_transcribes_a_file_and_reads_every_view_of_it(aai: Any) -> None:
    """``Transcriber().transcribe(path)``: the SDK uploads the file, creates the transcript
    and polls it until completed; then its sentences, paragraphs, subtitles, a fresh
    lookup, and its deletion."""
    config = aai.TranscriptionConfig(custom_spelling={"Nation": ["country"]})
    t = aai.Transcriber().transcribe(str(DATA / "jfk.wav"), config=config)
    assert t.status == aai.TranscriptStatus.completed, t.error
    assert t.audio_url.startswith(aai.settings.base_url + "/v2/upload/")
    assert "Nation" in t.text and "country" not in t.text.lower()
    assert wer(JFK_TEXT, t.text.replace("Nation", "country")) < 0.2
    assert t.language_code == "en" and t.audio_duration == 11 and 0 < t.confidence <= 1
    starts = [w.start for w in t.words]
    assert starts == sorted(starts) and 0 <= starts[0] and t.words[-1].end <= 11_000
    assert " ".join(w.text for w in t.words) == t.text
    assert t.utterances is None  # no speaker_labels asked
    sentences = t.get_sentences()
    assert " ".join(s.text for s in sentences) == t.text
    assert " ".join(p.text for p in t.get_paragraphs()) == t.text
    srt = t.export_subtitles_srt(chars_per_caption=32)
    cues = [block.split("\n")[2:] for block in srt.strip().split("\n\n")]
    assert len(cues) >= 3 and all(len(line) <= 32 for cue in cues for line in cue), srt
    vtt = t.export_subtitles_vtt()
    assert vtt.startswith("WEBVTT") and "Nation" in vtt and "country" not in vtt
    found = t.word_search(["nation", "Fellow Americans,", "country", "nation"])
    assert [(m.text, m.count) for m in found] == [
        ("nation", 2),
        ("fellow americans", 1),
        ("country", 0),  # custom_spelling wrote it Nation
    ]
    for match in found:
        for index, (start, end) in zip(match.indexes, match.timestamps, strict=True):
            assert t.words[index].start == start and start < end <= 11_000
    raw = requests.get(
        f"{aai.settings.base_url}/v2/transcript/{t.id}/word-search",
        params={"words": "nation,fellow americans"},
        headers=_auth(),
        timeout=30,
    ).json()
    assert raw["id"] == t.id and raw["total_count"] == 3
    for query in ("", ",,", "a b c d e f", ",".join(f"w{i}" for i in range(101))):
        bad = requests.get(
            f"{aai.settings.base_url}/v2/transcript/{t.id}/word-search",
            params={"words": query},
            headers=_auth(),
            timeout=30,
        )
        assert bad.status_code == 400 and "words" in bad.json()["error"], (query, bad.text)
    again = aai.Transcript.get_by_id(t.id)
    assert again.status == aai.TranscriptStatus.completed and again.text == t.text
    listed = aai.Transcriber().list_transcripts(aai.types.ListTranscriptParameters(limit=200))
    mine = [x for x in listed.transcripts if x.id == t.id]
    assert len(mine) == 1 and mine[0].status == aai.TranscriptStatus.completed
    assert mine[0].audio_url == t.audio_url and mine[0].created <= mine[0].completed
    created = [x.created for x in listed.transcripts]
    assert created == sorted(created, reverse=True)  # newest first
    errors = aai.Transcriber().list_transcripts(aai.types.ListTranscriptParameters(status="error"))
    assert t.id not in {x.id for x in errors.transcripts}
    assert all(x.status == aai.TranscriptStatus.error for x in errors.transcripts)
    assert aai.Transcript.delete_by_id(t.id).text == "Deleted by user."
    with pytest.raises(aai.types.TranscriptError, match="not found"):
        aai.Transcript.get_by_id(t.id)
    status = requests.get(f"{aai.settings.base_url}/v2/any/status/{t.id}", headers=_auth())
    assert status.status_code == 404  # its result went with it, from the job API too


@pytest.mark.e2e
def test_the_transcript_list_pages_older_and_newer_as_assemblyais(aai: Any) -> None:
    """``list_transcripts`` a page of one at a time: ``prev_url`` (``before_id``) walks to
    older transcripts, ``next_url`` (``after_id``) back to newer, each page newest first."""
    upload = requests.post(
        f"{aai.settings.base_url}/v2/upload",
        data=(DATA / "jfk.wav").read_bytes(),
        headers=_auth(),
        timeout=30,
    ).json()["upload_url"]
    made = [_create(aai.settings.base_url, {"audio_url": upload}).json()["id"] for _ in range(3)]
    params = aai.types.ListTranscriptParameters
    page = aai.Transcriber().list_transcripts(params(limit=1))
    walked = [page.transcripts[0].id]
    while page.page_details.prev_url and len(walked) < 50:
        before = parse_qs(urlsplit(page.page_details.prev_url).query)["before_id"][0]
        assert before == walked[-1]
        page = aai.Transcriber().list_transcripts(params(limit=1, before_id=before))
        walked += [t.id for t in page.transcripts]
    assert [i for i in walked if i in made] == made[::-1]  # newest first, each once
    oldest = made[0]
    newer = aai.Transcriber().list_transcripts(params(limit=2, after_id=oldest))
    assert [t.id for t in newer.transcripts] == [made[2], made[1]]
    two = aai.Transcriber().list_transcripts(params(limit=2, before_id=made[2]))
    assert [t.id for t in two.transcripts][:2] == [made[1], made[0]]
    assert "after_id=" + made[1] in (two.page_details.next_url or "")


@pytest.mark.e2e
def test_an_upload_over_the_inline_cap_but_under_the_body_cap_is_transcribed(
    aai: Any, tmp_path: Path
) -> None:
    """A 20-MB WAV (JFK, then ten minutes of a quiet room) is under the 30-MB body cap
    the server took it by, and over the queue's 15-MB inline cap: its transcript failed
    with INPUT_TOO_LARGE and a sentence about audio_base64, which the user never sent."""
    import numpy as np
    from faster_whisper import decode_audio

    from tests.media import write_wav

    jfk = decode_audio(str(DATA / "jfk.wav"))
    room = np.random.default_rng(0).normal(0, 0.001, 10 * 60 * 16000).astype(np.float32)
    path = write_wav(tmp_path / "long.wav", np.concatenate([jfk, room]))
    assert 15_000_000 < path.stat().st_size < 30_000_000
    t = aai.Transcriber().transcribe(str(path))
    assert t.status == aai.TranscriptStatus.completed, t.error
    assert wer(JFK_TEXT, t.text) < 0.2, t.text


@pytest.mark.e2e
def test_a_url_a_span_and_a_detected_language(aai: Any, audio_site: str) -> None:
    config = aai.TranscriptionConfig(
        language_detection=True, audio_start_from=5000, audio_end_at=11000
    )
    t = aai.Transcriber().transcribe(audio_site, config=config)
    assert t.status == aai.TranscriptStatus.completed, t.error
    assert t.audio_url == audio_site and t.language_code == "en"
    assert t.json_response["language_confidence"] > 0.5
    assert t.words[0].start >= 4500  # only the span was transcribed, on the file's clock
    assert "fellow" not in t.text.lower() and "country" in t.text.lower()


@pytest.mark.e2e
def test_multichannel_labels_each_word_and_utterance_with_its_channel(
    aai: Any, tmp_path: Path
) -> None:
    """AssemblyAI's multichannel: ``audio_channels``, each word's ``channel`` (from 1), and
    utterances whose speaker is their channel, in the order the call was said."""
    from tests.media import CALL_TEXTS, write_call_wav

    call = write_call_wav(tmp_path / "call.wav")
    t = aai.Transcriber().transcribe(str(call), config=aai.TranscriptionConfig(multichannel=True))
    assert t.status == aai.TranscriptStatus.completed, t.error
    assert t.json_response["audio_channels"] == 2 and t.json_response["multichannel"] is True
    assert [u.speaker for u in t.utterances] == ["1", "2", "1"]
    assert [u.channel for u in t.utterances] == ["1", "2", "1"]
    for n, expected in enumerate(CALL_TEXTS, 1):
        said = " ".join(w.text for w in t.words if w.channel == str(n))
        assert wer(expected, said) <= 0.3, said
    assert all(3000 <= w.start <= 9500 for w in t.words if w.channel == "2")
    assert {s.channel for s in t.get_sentences()} == {"1", "2"}
    assert "[channel" not in t.export_subtitles_srt()  # AssemblyAI's captions name no one


def _auth() -> dict[str, str]:
    return {"Authorization": KEY}


def _create(url: str, body: Any) -> requests.Response:
    return requests.post(f"{url}/v2/transcript", json=body, headers=_auth(), timeout=30)


@pytest.mark.e2e
def test_a_transcript_that_fails_says_why_and_refusals_say_what_to_send(
    server: Server, aai: Any
) -> None:
    upload = requests.post(
        f"{server.url}/v2/upload", data=b"this is not audio" * 50, headers=_auth(), timeout=30
    )
    assert upload.status_code == 200
    t = aai.Transcriber().transcribe(upload.json()["upload_url"])
    assert t.status == aai.TranscriptStatus.error and "audio" in t.error.lower(), t.error
    raw = requests.get(f"{server.url}/v2/transcript/{t.id}", headers=_auth(), timeout=30).json()
    assert raw["error_code"] == "UNSUPPORTED_OR_CORRUPT_MEDIA"  # beside AssemblyAI's fields
    speakers = aai.Transcriber().transcribe(
        str(DATA / "jfk.wav"), config=aai.TranscriptionConfig(speaker_labels=True)
    )  # this server has no diarizer: the transcript says so
    assert speakers.status == aai.TranscriptStatus.error and "DIARIZATION" in speakers.error
    with pytest.raises(aai.types.TranscriptError, match="summaries is not served"):
        aai.Transcriber().transcribe(
            str(DATA / "jfk.wav"), config=aai.TranscriptionConfig(summarization=True)
        )
    broken = _create(server.url, {"audio_url": "http://[::1"})  # urlsplit raised: a 500
    assert broken.status_code == 400 and "audio_url" in broken.json()["error"], broken.text
    refused = _create(server.url, {"audio_url": "https://example.com/a.wav", "fancy": 1})
    assert refused.status_code == 400 and "fancy" in refused.json()["error"]
    gone = _create(server.url, {"audio_url": f"{server.url}/v2/upload/{'0' * 32}"})
    assert gone.status_code == 400 and "upload again" in gone.json()["error"]
    for path in ("", "/sentences", "/srt"):
        missing = requests.get(f"{server.url}/v2/transcript/nope{path}", headers=_auth())
        assert missing.status_code == 404 and "not found" in missing.json()["error"]
    empty = requests.post(f"{server.url}/v2/upload", data=b"", headers=_auth(), timeout=30)
    assert empty.status_code == 400
    wide = requests.get(f"{server.url}/v2/transcript/{t.id}/srt?chars_per_caption=9000")
    assert wide.status_code == 401  # the key first
    wide = requests.get(
        f"{server.url}/v2/transcript/{t.id}/srt?chars_per_caption=9000", headers=_auth()
    )
    assert wide.status_code == 400 and "chars_per_caption" in wide.json()["error"]
    failed = requests.get(f"{server.url}/v2/transcript/{t.id}/sentences", headers=_auth())
    assert failed.status_code == 400 and "not completed" in failed.json()["error"]
    anon = requests.post(f"{server.url}/v2/transcript", json={"audio_url": "x"}, timeout=30)
    assert anon.status_code == 401
    assert KEY not in server.logs() and "not audio" not in json.dumps(raw)


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], Any]]]]:
    """A webhook receiver on 127.0.0.1: each call's headers and JSON body."""
    from http.server import BaseHTTPRequestHandler

    calls: list[tuple[dict[str, str], Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            calls.append((dict(self.headers), json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    site = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}/done", calls
    site.shutdown()
    site.server_close()


@pytest.mark.e2e
def test_a_webhook_gets_assemblyais_call_with_its_header(aai: Any, receiver: Any) -> None:
    url, calls = receiver
    config = aai.TranscriptionConfig().set_webhook(url, "X-Hook-Secret", "hook-secret-value")
    t = aai.Transcriber().transcribe(str(DATA / "jfk.wav"), config=config)
    assert t.status == aai.TranscriptStatus.completed, t.error
    from tests.helpers import wait_for

    wait_for(lambda: calls, 30, "the webhook's call")
    headers, body = calls[0]
    assert body == {"transcript_id": t.id, "status": "completed"}
    assert headers.get("X-Hook-Secret") == "hook-secret-value"
    got = wait_for(
        lambda: (g := aai.Transcript.get_by_id(t.id)).webhook_status_code and g, 30, "its report"
    )
    assert got.webhook_status_code == 200 and got.webhook_auth is True
    raw = requests.get(f"{aai.settings.base_url}/v2/transcript/{t.id}", headers=_auth()).json()
    assert raw["webhook_url"] == url and "hook-secret-value" not in json.dumps(raw)


# --- streaming: /v3/ws ------------------------------------------------------------------

RATE = 16000
CHUNK = RATE * 2 // 10  # 100 ms of pcm_s16le
PACE_S = 0.025  # 4x real time


def _readings(n: int, gap_s: float = 1.5) -> tuple[Any, list[Any]]:
    import numpy as np

    from speech_assets.clips import clips

    spoken = clips()[:n]
    gap = np.zeros(int(gap_s * RATE), dtype=np.float32)
    return np.concatenate(
        [gap[: RATE // 2]] + [x for c in spoken for x in (c.samples, gap)]
    ), spoken


@pytest.mark.e2e
def test_the_assemblyai_sdks_streaming_client_gets_each_turn_formatted(server: Server) -> None:
    """AssemblyAI's SDK (StreamingClient) pointed at ws://: Begin, partial turns, each
    turn's end (unformatted, then formatted with format_turns), words on the stream's
    clock, Termination with the audio's length after Terminate."""
    from assemblyai.streaming.v3 import (
        StreamingClient,
        StreamingClientOptions,
        StreamingEvents,
        StreamingParameters,
    )

    audio, spoken = _readings(3)
    # disconnect(terminate=True) waits terminate_timeout (5 s by default) for Termination,
    # which comes once the last turns are transcribed: a busy machine needs longer.
    client = StreamingClient(
        StreamingClientOptions(
            api_key=KEY, api_host=server.url.replace("http", "ws"), terminate_timeout=120
        )
    )
    events: list[Any] = []
    ended = threading.Event()
    for kind in (StreamingEvents.Begin, StreamingEvents.Turn, StreamingEvents.Error):
        client.on(kind, lambda _c, e: events.append(e))
    client.on(StreamingEvents.Termination, lambda _c, e: (events.append(e), ended.set()))
    client.connect(
        StreamingParameters(
            sample_rate=RATE,
            format_turns=True,
            language_detection=True,
            speech_model="universal-streaming-english",
            keyterms_prompt=["Americans"],
        )
    )
    pcm = pcm16(audio)
    for i in range(0, len(pcm), CHUNK):
        client.stream(pcm[i : i + CHUNK])
        time.sleep(PACE_S)
    client.disconnect(terminate=True)
    assert ended.wait(60), [type(e).__name__ for e in events]
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "BeginEvent" and kinds[-1] == "TerminationEvent", kinds
    assert "ErrorEvent" not in kinds, events
    assert abs(events[-1].audio_duration_seconds - len(audio) / RATE) <= 1
    turns = [e for e in events if kinds[events.index(e)] == "TurnEvent"]
    formatted = [t for t in turns if t.end_of_turn and t.turn_is_formatted]
    raw = [t for t in turns if t.end_of_turn and not t.turn_is_formatted]
    assert len(formatted) == len(raw) >= 3, [(t.turn_order, t.transcript) for t in turns]
    assert [t.turn_order for t in formatted] == list(range(len(formatted)))
    text = " ".join(t.transcript for t in formatted)
    assert wer(" ".join(c.text for c in spoken), text) < 0.25, text
    last = 0
    for r, f in zip(raw, formatted, strict=True):
        assert r.turn_order == f.turn_order and r.transcript == r.transcript.lower()
        assert f.language_code == "en" and f.language_confidence > 0.5  # language_detection
        assert [w.text for w in f.words] == f.transcript.split()
        for w in f.words:  # in order, on the stream's clock, inside the audio
            assert last - 50 <= w.start <= w.end <= len(audio) * 1000 // RATE and w.word_is_final
            last = w.end
    partials = [t for t in turns if not t.end_of_turn]
    assert partials, [(t.turn_order, t.transcript) for t in turns]
    for t in partials:  # a partial belongs to a turn whose end comes later; its words timed
        assert t.turn_order in {f.turn_order for f in formatted}
        assert t.transcript == " ".join(w.text for w in t.words), t
        assert all(0 <= w.start <= w.end <= len(audio) * 1000 // RATE for w in t.words)


def _ws(srv: Server, query: str, **kwargs: Any) -> Any:
    from websockets.sync.client import connect

    kwargs.setdefault("additional_headers", {"Authorization": KEY})
    url = srv.url.replace("http", "ws") + f"/v3/ws?{query}"
    return connect(url, open_timeout=30, **kwargs)


@pytest.mark.e2e
def test_force_endpoint_ends_a_turn_and_refusals_close_with_a_reason(server: Server) -> None:
    """ForceEndpoint (what Pipecat sends when its own VAD hears the user stop) ends the turn
    under way at once, without waiting for silence; mu-law at 8 kHz is served; what cannot
    be served closes the connection with 3006 and says why; no key, no session."""
    import audioop  # the standard G.711 coder (deprecated in 3.11, still here)

    from websockets.exceptions import ConnectionClosed, InvalidStatus

    from speech_assets.clips import JFK_TEXT as JFK

    audio, _ = _readings(1)
    audio = audio[: -int(1.5 * RATE)]  # JFK's words and nothing after them
    eight = audioop.ratecv(pcm16(audio), 2, 1, RATE, 8000, None)[0]
    query = "sample_rate=8000&encoding=pcm_mulaw&format_turns=false&min_turn_silence=5000"
    with _ws(server, query) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "Begin"
        ws.send(audioop.lin2ulaw(eight, 2))  # speech, no trailing silence
        ws.send(json.dumps({"type": "ForceEndpoint"}))
        # Without ForceEndpoint the turn ("... for your country") would end only after 5 s
        # of silence, and none follows it. Its end comes before Terminate is sent.
        finals: list[str] = []
        deadline = time.monotonic() + 60
        while not finals or not finals[-1].endswith("country"):
            message = json.loads(ws.recv(timeout=deadline - time.monotonic()))
            if message["type"] == "Turn" and message["end_of_turn"]:
                assert not message["turn_is_formatted"]  # format_turns=false
                finals.append(message["transcript"])
        assert wer(JFK, " ".join(finals)) < 0.3, finals
        ws.send(json.dumps({"type": "UpdateConfiguration", "keyterms_prompt": ["a"] * 101}))
        error = json.loads(ws.recv(timeout=30))  # named as AssemblyAI names it, not ours
        assert error["type"] == "Error" and error["error"].startswith("keyterms_prompt"), error
        ws.send(json.dumps({"type": "KeepAlive"}))
        ws.send(json.dumps({"type": "Terminate"}))
        assert until(ws, "Termination")[-1]["audio_duration_seconds"] >= 11
    for query, said in (
        ("sample_rate=16000&speaker_labels=true", "speaker labels"),
        ("encoding=opus", "pcm_s16le"),
        ("encoding=pcm_s16le", "sample_rate"),
        ("sample_rate=16000&keyterms_prompt=notjson", "keyterms_prompt"),
        # An LLM run on the turns (the SDK's llm_gateway) was taken and never answered.
        (f"sample_rate=16000&llm_gateway={quote(json.dumps({'model': 'x'}))}", "llm_gateway"),
        ("sample_rate=16000&language_code=zz", "language_code: language 'zz'"),
        (
            f"sample_rate=16000&keyterms_prompt={quote(json.dumps(['a'] * 101))}",
            "keyterms_prompt: at",
        ),
    ):
        with _ws(server, query) as ws:
            message = json.loads(ws.recv(timeout=30))
            assert message["type"] == "Error" and said in message["error"], message
            assert "session." not in message["error"], message  # the client's names, not ours
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 3006
    with pytest.raises(InvalidStatus) as refused:
        _ws(server, "sample_rate=16000", additional_headers={"Authorization": "wrong"})
    assert refused.value.response.status_code == 401


@pytest.mark.e2e
def test_update_configuration_changes_the_turns_in_the_middle_of_a_stream(server: Server) -> None:
    """LiveKit's AssemblyAI plugin sends ``UpdateConfiguration`` with ``max_turn_silence``,
    ``min_turn_silence``, ``end_of_turn_confidence_threshold`` and ``vad_threshold`` when its
    options change, Pipecat's with ``language_codes``: all were taken and ignored. Now, after
    ``end_of_turn_confidence_threshold: 1`` and a 4-s ``max_turn_silence``, two readings
    1.5 s apart are one turn (ForceEndpoint ends it); a bad value is an Error that names it,
    nothing changed; ``language_codes`` the model cannot serve are refused by name."""
    import numpy as np

    audio, spoken = _readings(2)
    with _ws(server, f"sample_rate={RATE}&min_turn_silence=400") as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "Begin"
        for bad, name in (({"vad_threshold": 2}, "vad_threshold"),
                          ({"max_turn_silence": [1]}, "max_turn_silence"),
                          ({"language_codes": ["es"]}, "language_code")):  # fmt: skip
            ws.send(json.dumps({"type": "UpdateConfiguration", **bad}))
            error = json.loads(ws.recv(timeout=30))
            assert error["type"] == "Error" and error["error"].startswith(name), error
        update = {"end_of_turn_confidence_threshold": 1, "max_turn_silence": 4000}
        ws.send(json.dumps({"type": "UpdateConfiguration", **update}))
        pcm = pcm16(np.asarray(audio[:-RATE]))  # the last reading, then 0.5 s
        for i in range(0, len(pcm), CHUNK):
            ws.send(pcm[i : i + CHUNK])
            time.sleep(PACE_S)
        ws.send(json.dumps({"type": "ForceEndpoint"}))
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while not any(m.get("end_of_turn") for m in got):
            got.append(json.loads(ws.recv(timeout=deadline - time.monotonic())))
        ws.send(json.dumps({"type": "Terminate"}))
        got += until(ws, "Termination")
    assert not [m for m in got if m["type"] == "Error"], got
    ends = [m for m in got if m["type"] == "Turn" and m["end_of_turn"]]
    assert ends[0]["turn_order"] == 0, ends
    assert wer(" ".join(c.text for c in spoken), ends[0]["transcript"]) < 0.3, ends[0]


@pytest.mark.e2e
def test_pipecats_assemblyai_service_with_its_defaults(server: Server) -> None:
    """Pipecat's AssemblyAISTTService as its docs show it, inside a real pipeline, with only
    ``api_endpoint_base_url`` pointed here: its defaults (universal-3-6-pro, formatted
    turns, 100-ms turn silences, a ForceEndpoint at each of its own VAD's stops). Pipecat
    takes a turn's formatted end as its transcript: every turn is heard, no error."""
    pytest.importorskip("pipecat", reason="pip install '.[dev]' (pipecat-ai)")
    from pipecat.services.assemblyai.stt import AssemblyAISTTService

    from speech_assets.clips import clips

    spoken = clips()[:2]
    before = len(server.logs())
    url = server.url.replace("http", "ws") + "/v3/ws"
    finals, errors = pipecat_turns(
        lambda: AssemblyAISTTService(api_key=KEY, api_endpoint_base_url=url),
        lambda stt: stt._websocket is not None,
        spoken,
        tail_s=0.2,
    )
    assert errors == [], errors
    text = " ".join(finals)
    assert wer(" ".join(c.text for c in spoken), text) < 0.25, text
    assert any(t[:1].isupper() for t in finals), finals  # the formatted turns, not the raw
    no_error_logged(server.logs()[before:])


@pytest.mark.e2e
def test_livekits_assemblyai_plugin_streams_every_turn(server: Server) -> None:
    """LiveKit Agents' AssemblyAI plugin (1.8.9) as its docs show it, with only ``base_url``
    pointed here: its defaults (universal-streaming-english, 100-ms min_turn_silence), 20-ms
    frames as LiveKit's rooms deliver them. Its interim transcripts are built from the
    partials' words, its finals from each turn's end."""
    pytest.importorskip("livekit.plugins.assemblyai", reason="pip install '.[dev]'")
    from livekit.agents import stt as agents_stt
    from livekit.plugins import assemblyai as lk_assemblyai

    audio, spoken = _readings(3)
    reference = " ".join(c.text for c in spoken)
    before = len(server.logs())
    url = server.url.replace("http", "ws")
    events = livekit_events(lambda: lk_assemblyai.STT(api_key=KEY, base_url=url), audio, reference)
    kinds = [e.type for e in events]
    final = agents_stt.SpeechEventType.FINAL_TRANSCRIPT
    text = " ".join(e.alternatives[0].text for e in events if e.type == final)
    assert wer(reference, text) < 0.25, text
    assert agents_stt.SpeechEventType.START_OF_SPEECH in kinds
    assert agents_stt.SpeechEventType.INTERIM_TRANSCRIPT in kinds
    assert agents_stt.SpeechEventType.END_OF_SPEECH in kinds
    no_error_logged(server.logs()[before:])
