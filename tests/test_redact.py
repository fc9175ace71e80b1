"""``redact``: numbers masked ("**** ****") in everything a job returns.

Pure tier: the rule (runs of three numerals or more; a run of digits at a segment's edge)
and generated inputs. Job tier: the real tiny.en on real speech (tests/data/en_numbers.flac,
espeak-ng reading a card number and a security code), through the pipeline, its stream
included. Faces: the real ``python -m handler serve`` on 127.0.0.1, driven by Deepgram's,
OpenAI's and AssemblyAI's SDKs, a raw WebSocket on Deepgram's live route (its interim
results too) and the openai SDK's realtime client.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from handler.errors import Code, WorkerError
from handler.output import redact
from handler.pipeline.job import run_job
from handler.schema import parse_job_input, typed_form
from tests.helpers import DATA
from tests.test_http import Server
from tests.test_profanity import KEY, clip_pcm, faces_server, feed

CLIP = DATA / "en_numbers.flac"
RATE = 16000
DIGIT = re.compile(r"\d")
MASKED = re.compile(r"\*(?:[ \-./,:]{0,2}\*){2,}")
"""Three masked numerals in a row (the clip's digits come as "4-1-1-1" or "4111")."""


def test_runs_of_three_numerals_are_masked_in_place() -> None:
    said = "My card is 4111 1111 1111 1111, expires 12/27, code 123. Call 555-0199."
    assert redact.text(said) == (
        "My card is **** **** **** ****, expires **/**, code ***. Call ***-****."
    )
    assert redact.text("four one one one, please") == "**** *** *** ***, please"
    # Fewer than three numerals inside a text: left alone; words that are not numerals too.
    for clean in ("I have 2 cats and 45 dogs here.", "One of them, one or two.", "No numbers."):
        assert redact.text(clean) == clean
    # At a segment's edge a run of digits may go on in the next segment: masked.
    assert redact.text(" The code is 12", edges=True) == " The code is **"
    assert redact.text("34 and then", edges=True) == "** and then"
    assert redact.text(" One of them", edges=True) == " One of them"  # a word, most often
    assert redact.text(" my card is four one", edges=True) == " my card is **** ***"


def test_a_warning_keeps_its_times_and_masks_what_it_quotes() -> None:
    said = "repetition loop at 125.3-140.0 s ('card 4111 1' x40): collapsed to one"
    assert redact.quoted(said) == (
        "repetition loop at 125.3-140.0 s ('card **** *' x40): collapsed to one"
    )
    assert redact.quoted("ran sequentially instead of batched: 1234") == (
        "ran sequentially instead of batched: 1234"
    )


NUMBERISH = st.one_of(
    st.from_regex(r"\d{1,6}", fullmatch=True),
    st.sampled_from(["one", "Two", "nine", "forty", "hundred", "cats", "the", "code", "is"]),
)
SEPARATORS = st.sampled_from([" ", "-", ", ", ". ", "/", " and ", "  ", ": "])


@given(st.lists(st.tuples(NUMBERISH, SEPARATORS), max_size=12))
def test_no_three_digits_in_a_row_survive(parts: list[tuple[str, str]]) -> None:
    text = "".join(a + b for a, b in parts)
    out = redact.text(text, edges=True)
    assert len(out) == len(text)
    # Only letters and digits change, and only to asterisks.
    assert all(a == b or (a.isalnum() and b == "*") for a, b in zip(text, out, strict=True))
    # No three digits joined by at most two separators are left, and no digit at an end.
    assert not re.search(r"\d(?:[ \-./,:]{0,2}\d){2,}", out), (text, out)
    assert not re.match(r"[\W_]*\d", out) and not re.search(r"\d[\W_]*$", out), (text, out)


def test_a_segments_words_still_spell_its_text() -> None:
    seg: Any = {
        "id": 1,
        "text": " Card 4111 1111, thanks.",
        "tokens": [1, 2, 3],
        "words": [{"word": w, "start": 0.0, "end": 1.0} for w in (" Card", " 4111", " 1111,")]
        + [{"word": " thanks.", "start": 1.0, "end": 1.5}],
    }
    out = redact.segment(seg)
    assert out["text"] == " Card **** ****, thanks." and out["tokens"] == []
    assert "".join(w["word"] for w in out["words"]) == out["text"]
    assert seg["text"] == " Card 4111 1111, thanks."  # the segment given is not changed
    plain: Any = {"id": 2, "text": " Nothing here.", "tokens": [4]}
    assert redact.segment(plain) is plain


def test_what_cannot_be_redacted_is_refused_by_name() -> None:
    for bad in (["pii"], ["numbers", "pci", "ssn", "numbers"], "pci", [1]):
        with pytest.raises(WorkerError) as info:
            parse_job_input({"audio_url": "https://x.test/a.wav", "redact": bad})
        assert info.value.code is Code.INVALID_INPUT and "redact" in info.value.message
    # A form field is text: a comma list, as the OpenAI route's multipart form sends it.
    assert typed_form({"redact": "pci, ssn"})["redact"] == ["pci", "ssn"]


def test_assemblyais_number_policies_are_served_and_the_others_refused() -> None:
    from handler.faces.assemblyai import request as aai_request
    from handler.faces.assemblyai.shape import hashed

    masked = {"text": " Card ****, code *-*-*. What the s***!", "words": [{"word": " ****,"}]}
    got = hashed(masked)
    assert got["text"] == " Card ####, code #-#-#. What the s***!"  # profanity keeps its "*"
    assert got["words"] == [{"word": " ####,"}] and masked["text"].count("*") == 10

    asked = {"audio_url": "u", "redact_pii": True, "redact_pii_sub": "hash"}
    job, echo = aai_request.job_for(
        {**asked, "redact_pii_policies": ["credit_card_number", "us_social_security_number"]}, []
    )
    assert job["redact"] == ["numbers"] and echo["redact_pii_policies"][0] == "credit_card_number"
    for bad, said in (
        ({"redact_pii_policies": ["credit_card_number", "person_name"]}, "person_name"),
        ({"redact_pii_policies": []}, "redact_pii_policies"),
        ({"redact_pii_policies": ["phone_number"], "redact_pii_sub": "entity_name"}, "hash"),
    ):
        with pytest.raises(aai_request.Refused, match=said):
            aai_request.job_for({**asked, **bad}, [])


@pytest.mark.e2e
def test_a_job_masks_its_text_segments_words_subtitles_and_stream(worker) -> None:
    audio = base64.b64encode(CLIP.read_bytes()).decode()
    job = {"audio_base64": audio, "output": ["text", "segments", "words", "srt", "vtt"]}
    plain = run_job({**job, "word_timestamps": True}, worker)
    assert len(DIGIT.findall(plain["text"])) >= 12, plain["text"]  # the clip says them
    streamed: list[Any] = []
    got = run_job(
        {**job, "word_timestamps": True, "redact": ["pci"], "transcription": "srt"},
        worker,
        on_segment=streamed.append,
    )
    assert "error" not in got, got
    cues = [line for line in got["srt"].splitlines() if "-->" not in line and not line.isdigit()]
    vtt = [line for line in got["vtt"].splitlines() if "-->" not in line]
    for where in (
        got["text"],
        " ".join(cues),
        " ".join(vtt),
        " ".join(s["text"] for s in got["segments"]),
        " ".join(w["word"] for w in got["words"]),
        " ".join(s["text"] for s in streamed),
    ):
        assert not DIGIT.search(where) and MASKED.search(where), where
    # Only the numbers changed: the rest of the transcript is the same, timed as it was.
    assert redact.text(plain["text"], edges=True) == got["text"]
    assert [w["start"] for w in got["words"]] == [w["start"] for w in plain["words"]]
    assert "security" in got["text"].lower()
    assert all(s["tokens"] == [] for s in got["segments"] if "*" in s["text"])


# --- the faces: Deepgram and OpenAI over HTTP and live -------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = faces_server()
    yield srv
    srv.stop()


@pytest.mark.e2e
def test_the_deepgram_and_openai_sdks_get_files_redacted(server: Server) -> None:
    from openai import OpenAI

    from tests.test_deepgram import sdk_media

    data = CLIP.read_bytes()
    media = sdk_media(server, KEY)
    got = media.transcribe_file(request=data, model="nova-3", redact=["pci", "ssn"])
    alt = got.results.channels[0].alternatives[0]
    words = " ".join(f"{w.word} {w.punctuated_word}" for w in alt.words)
    assert not DIGIT.search(alt.transcript + words) and MASKED.search(alt.transcript), alt
    clear = media.transcribe_file(request=data, model="nova-3")  # asked for nothing: as said
    assert DIGIT.search(clear.results.channels[0].alternatives[0].transcript)

    client = OpenAI(base_url=server.url + "/v1", api_key=KEY)
    with CLIP.open("rb") as f:
        verbose = client.audio.transcriptions.create(
            model="whisper-1",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
            extra_body={"redact": "numbers"},
        )
    said = verbose.text + " ".join(w.word for w in verbose.words or [])
    said += " ".join(s.text for s in verbose.segments or [])
    assert not DIGIT.search(said) and MASKED.search(verbose.text), verbose.text


@pytest.mark.e2e
def test_assemblyais_sdk_gets_its_transcript_and_subtitles_redacted(server: Server) -> None:
    import assemblyai as aai

    saved = aai.settings.model_copy()
    try:
        aai.settings.base_url, aai.settings.api_key = server.url, KEY
        aai.settings.polling_interval = 0.2
        config = aai.TranscriptionConfig().set_redact_pii(
            policies=[
                aai.PIIRedactionPolicy.credit_card_number,
                aai.PIIRedactionPolicy.credit_card_cvv,
            ]
        )
        transcript = aai.Transcriber(config=config).transcribe(str(CLIP))
        assert transcript.status == "completed", transcript.error
        srt = transcript.export_subtitles_srt().splitlines()
        cues = [line for line in srt if "-->" not in line and not line.isdigit()]
        said = [transcript.text, *(w.text for w in transcript.words), *cues]
        said += [s.text for s in transcript.get_sentences()]
        assert not DIGIT.search(" ".join(said)), said
        # Written as AssemblyAI's default substitution (hash) writes them: "#-#-#", no "*".
        hashes = re.compile(r"#(?:[ \-./,:]{0,2}#){2,}")
        assert hashes.search(transcript.text) and "*" not in " ".join(said), said
        assert all(hashes.search(line) for line in cues if "security" in line), cues
        assert transcript.json_response["redact_pii"] is True  # echoed, as AssemblyAI's
        person = aai.TranscriptionConfig().set_redact_pii(
            policies=[aai.PIIRedactionPolicy.person_name]
        )
        with pytest.raises(aai.types.TranscriptError, match="person_name is not served"):
            aai.Transcriber(config=person).transcribe(str(CLIP))  # a 400, never unredacted
    finally:
        for name in ("base_url", "api_key", "polling_interval"):
            setattr(aai.settings, name, getattr(saved, name))


@pytest.mark.e2e
def test_live_deepgram_redacts_interim_and_final_results(server: Server) -> None:
    """Every result a live client sees is redacted: a number never flashes in an interim
    result (a part of it sent before the rest would be the number given away)."""
    from websockets.sync.client import connect

    ws_url = server.url.replace("http://", "ws://")
    query = (
        "/v1/listen?model=nova-3&encoding=linear16&sample_rate=16000&interim_results=true"
        "&redact=pci&redact=true"
    )
    auth = {"Authorization": f"Token {KEY}"}
    with connect(ws_url + query, additional_headers=auth, open_timeout=30) as ws:
        feeder = feed(ws.send, clip_pcm(CLIP), {"type": "CloseStream"})
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while not got or got[-1].get("type") != "Metadata":
            got.append(json.loads(ws.recv(timeout=deadline - time.monotonic())))
        feeder.join()
    results = [m for m in got if m.get("type") == "Results"]
    texts = [r["channel"]["alternatives"][0]["transcript"] for r in results]
    words = [w["word"] for r in results for w in r["channel"]["alternatives"][0]["words"]]
    finals = " ".join(t for r, t in zip(results, texts, strict=True) if r["is_final"])
    assert not DIGIT.search(" ".join(texts + words)) and MASKED.search(finals), texts


@pytest.mark.e2e
def test_a_realtime_session_redacts_its_deltas_and_transcripts(server: Server) -> None:
    from faster_whisper import decode_audio
    from openai import OpenAI

    from tests.test_realtime import SESSION, pcm24

    samples = np.concatenate([decode_audio(str(CLIP)), np.zeros(2 * RATE, np.float32)])
    session: Any = json.loads(json.dumps(SESSION))
    session["audio"]["input"]["transcription"]["redact"] = ["pci"]
    client = OpenAI(base_url=server.url + "/v1", api_key=KEY)
    said: list[str] = []
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session=session)
        updated = conn.recv().model_dump()
        assert updated["session"]["audio"]["input"]["transcription"]["redact"] == ["pci"]
        pcm = pcm24(samples)
        feeder = feed(
            lambda b: conn.input_audio_buffer.append(audio=base64.b64encode(b).decode()), pcm
        )
        deadline = time.monotonic() + 120
        completed = 0
        while time.monotonic() < deadline and not (completed and not feeder.is_alive()):
            ev = conn.recv()
            if ev.type.endswith("transcription.delta"):
                said.append(ev.delta)
            elif ev.type.endswith("transcription.completed"):
                said.append(ev.transcript)
                completed += 1
        feeder.join()
        conn.session.update(
            session={
                "type": "transcription",
                "audio": {"input": {"transcription": {"redact": ["pii"]}}},
            }
        )
        refused = conn.recv()
    assert completed and not DIGIT.search(" ".join(said)) and MASKED.search(" ".join(said)), said
    assert refused.type == "error" and "redact" in refused.error.message


@pytest.mark.e2e
def test_assemblyais_streaming_client_gets_every_turn_redacted(server: Server) -> None:
    """AssemblyAI's streaming ``redact_pii`` (its SDK's StreamingParameters have it) was
    refused at connect. Number policies are served now as on files: no digit in any
    partial or final turn, formatted or not, numbers written as ``#``; a policy that is
    not numbers is still refused (3006), never answered unredacted."""
    import threading

    from assemblyai.streaming.v3 import (
        StreamingClient,
        StreamingClientOptions,
        StreamingEvents,
        StreamingParameters,
    )
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    host = server.url.replace("http", "ws")
    client = StreamingClient(
        StreamingClientOptions(api_key=KEY, api_host=host, terminate_timeout=120)
    )
    turns: list[Any] = []
    errors: list[Any] = []
    ended = threading.Event()
    client.on(StreamingEvents.Turn, lambda _c, e: turns.append(e))
    client.on(StreamingEvents.Error, lambda _c, e: errors.append(e))
    client.on(StreamingEvents.Termination, lambda _c, e: ended.set())
    client.connect(
        StreamingParameters(
            sample_rate=16000,
            format_turns=True,
            redact_pii=True,
            redact_pii_policies=["credit_card_number", "credit_card_cvv"],
        )
    )
    feed(client.stream, clip_pcm(CLIP)).join()
    client.disconnect(terminate=True)
    assert ended.wait(120) and not errors, errors
    said = [t.transcript for t in turns] + [w.text for t in turns for w in t.words]
    assert turns and not DIGIT.search(" ".join(said)), said
    assert "#" in " ".join(t.transcript for t in turns if t.end_of_turn), said
    assert "*" not in " ".join(said), said  # as AssemblyAI's hash substitution writes them
    query = 'sample_rate=16000&redact_pii=true&redact_pii_policies=["person_name"]'
    with connect(f"{host}/v3/ws?{query}", additional_headers={"Authorization": KEY}) as ws:
        message = json.loads(ws.recv(timeout=30))
        assert message["type"] == "Error" and "person_name" in message["error"], message
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
