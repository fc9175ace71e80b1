"""Output formats checked with real parsers (srt, webvtt-py) and OpenAI's field names.

Pure tier: no model, no I/O; segments are dicts shaped like faster-whisper's Segment.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
import srt
import webvtt

from handler.output import formats
from handler.output.formats import (
    FORMATS,
    format_timestamp,
    language_name,
    render,
    segments_public,
    to_srt,
    to_text,
    to_verbose_json,
    to_vtt,
    words,
)

# Field sets of openai-python's TranscriptionVerbose, TranscriptionSegment and
# TranscriptionWord, written out here (not imported from the module) so a rename there fails.
OPENAI_VERBOSE_KEYS = {"task", "language", "duration", "text", "segments"}
OPENAI_SEGMENT_KEYS = {
    "id",
    "seek",
    "start",
    "end",
    "text",
    "tokens",
    "temperature",
    "avg_logprob",
    "compression_ratio",
    "no_speech_prob",
}
OPENAI_WORD_KEYS = {"word", "start", "end"}


def seg(i, start, end, text, words_=None, **extra):
    base = {
        "id": i,
        "seek": i * 3000,
        "start": start,
        "end": end,
        "text": text,
        "tokens": [50364, 400 + i, 50514],
        "temperature": 0.0,
        "avg_logprob": -0.25,
        "compression_ratio": 1.3,
        "no_speech_prob": 0.01,
        "words": words_,
    }
    base.update(extra)
    return base


def w(word, start, end, p=0.9):
    return {"start": start, "end": end, "word": word, "probability": p}


JFK = [
    seg(
        1,
        0.0,
        3.0,
        " And so my fellow Americans,",
        [
            w(" And", 0.0, 0.5),
            w(" so", 0.5, 1.1),
            w(" my", 1.1, 1.5),
            w(" fellow", 1.5, 2.2),
            w(" Americans,", 2.2, 3.0),
        ],
    ),
    seg(
        2,
        3.001,
        7.6,
        " ask not what your country can do for you,",
        [
            w(" ask", 3.001, 3.5),
            w(" not", 3.5, 4.0),
            w(" what", 4.0, 4.6),
            w(" your", 4.6, 5.0),
            w(" country", 5.0, 5.8),
            w(" can", 5.8, 6.2),
            w(" do", 6.2, 6.6),
            w(" for", 6.6, 7.0),
            w(" you,", 7.0, 7.6),
        ],
    ),
    seg(3, 7.6, 3725.4567, " ask what you can do for your country.", None),
]


def ms(seconds: float) -> int:
    """Independent reference rounding (half-up on the decimal literal) for the tests."""
    from decimal import ROUND_HALF_UP, Decimal

    return int(Decimal(str(seconds)).scaleb(3).quantize(Decimal(1), ROUND_HALF_UP))


def vtt_ms(stamp: str) -> int:
    hms, frac = stamp.split(".")
    h, m, s = (int(x) for x in hms.split(":"))
    assert len(frac) == 3
    return ((h * 60 + m) * 60 + s) * 1000 + int(frac)


# --- timestamps -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "00:00:00,000"),
        (0.0, "00:00:00,000"),
        (1.001, "00:00:01,001"),  # float modulo gives 00:00:01,000
        (0.0005, "00:00:00,001"),  # half-up, not banker's
        (0.0004, "00:00:00,000"),
        (59.9995, "00:01:00,000"),  # carry into minutes
        (59.9994, "00:00:59,999"),
        (3599.9995, "01:00:00,000"),  # carry into hours
        (3600, "01:00:00,000"),
        (3725.4567, "01:02:05,457"),
        (36000.0, "10:00:00,000"),
        (360000.25, "100:00:00,250"),  # hours widen past two digits, never wrap
        (-0.5, "00:00:00,000"),
        (-3600, "00:00:00,000"),
    ],
)
def test_format_timestamp(seconds, expected):
    assert format_timestamp(seconds) == expected


def test_format_timestamp_options():
    assert format_timestamp(1.001, decimal_marker=".") == "00:00:01.001"
    assert format_timestamp(61.5, always_include_hours=False) == "01:01,500"
    assert format_timestamp(3661.5, always_include_hours=False) == "01:01:01,500"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_format_timestamp_rejects_non_finite(bad):
    with pytest.raises(ValueError):
        format_timestamp(bad)


# --- text -------------------------------------------------------------------------------


def test_to_text_strips_and_joins():
    assert to_text(JFK) == (
        "And so my fellow Americans, ask not what your country can do for you, "
        "ask what you can do for your country."
    )
    assert to_text([seg(0, 0, 1, "  "), seg(1, 1, 2, " hi ")]) == "hi"
    assert to_text([]) == ""


# --- SRT --------------------------------------------------------------------------------


def test_srt_parses_with_real_parser_and_matches_segments():
    out = to_srt(JFK)
    subs = list(srt.parse(out))
    assert [s.index for s in subs] == [1, 2, 3]
    for sub, s in zip(subs, JFK, strict=True):
        assert sub.start == timedelta(milliseconds=ms(s["start"]))
        assert sub.end == timedelta(milliseconds=ms(s["end"]))
        assert sub.content == s["text"].strip()
    assert "00:00:03,001 --> 00:00:07,600" in out
    assert "00:00:07,600 --> 01:02:05,457" in out
    assert out.startswith("1\n00:00:00,000 --> 00:00:03,000\nAnd so my fellow Americans,\n\n2\n")


def test_srt_negative_control_parser_validates():
    with pytest.raises(srt.SRTParseError):
        list(srt.parse("1\n00:00:00.000 -> 00:00:01,000\nbroken timestamp\n"))


def test_srt_skips_empty_segments_and_renumbers():
    segs = [seg(0, 0, 1, " one"), seg(1, 1, 2, "   "), seg(2, 2, 3, ""), seg(3, 3, 4, " two")]
    subs = list(srt.parse(to_srt(segs)))
    assert [(s.index, s.content) for s in subs] == [(1, "one"), (2, "two")]


def test_srt_empty_input():
    assert to_srt([]) == ""
    assert list(srt.parse(to_srt([]))) == []


def test_srt_end_never_before_start():
    subs = list(srt.parse(to_srt([seg(0, 5.0, 4.0, " backwards")])))
    assert subs[0].start == subs[0].end == timedelta(seconds=5)


def test_srt_arrow_and_markup_in_text():
    segs = [seg(0, 0, 1, " a --> b ---> c <b>&"), seg(1, 1, 2, " next")]
    out = to_srt(segs)
    subs = list(srt.parse(out))
    assert len(subs) == 2
    assert "-->" not in subs[0].content
    assert subs[0].content == "a -> b -> c <b>&"
    # Exactly one arrow per cue: the timing line.
    assert out.count("-->") == 2


def test_srt_newlines_and_blank_lines_in_text_do_not_split_cues():
    segs = [
        seg(0, 0, 1, " first line\n\n2\n00:00:05,000 --> 00:00:06,000\nfake"),
        seg(1, 1, 2, "x"),
    ]
    subs = list(srt.parse(to_srt(segs)))
    assert len(subs) == 2
    assert "\n" not in subs[0].content


def test_srt_words_per_cue():
    subs = list(srt.parse(to_srt(JFK, words_per_cue=3)))
    # 5 words -> 2 cues, 9 words -> 3 cues, segment without words -> 1 cue.
    assert [s.content for s in subs] == [
        "And so my",
        "fellow Americans,",
        "ask not what",
        "your country can",
        "do for you,",
        "ask what you can do for your country.",
    ]
    assert subs[0].start == timedelta(0) and subs[0].end == timedelta(seconds=1.5)
    assert subs[2].start == timedelta(milliseconds=3001)
    assert [s.index for s in subs] == list(range(1, 7))
    with pytest.raises(ValueError):
        to_srt(JFK, words_per_cue=0)


# --- WebVTT -----------------------------------------------------------------------------


def test_vtt_parses_with_real_parser_and_matches_segments():
    out = to_vtt(JFK)
    assert out.startswith("WEBVTT\n\n")
    captions = list(webvtt.from_string(out))
    assert len(captions) == len(JFK)
    for cap, s in zip(captions, JFK, strict=True):
        assert vtt_ms(cap.start) == ms(s["start"])
        assert vtt_ms(cap.end) == ms(s["end"])
        assert cap.text == s["text"].strip()
    # read_buffer is the other public entry point; same result.
    assert [c.text for c in webvtt.from_buffer(io.StringIO(out))] == [c.text for c in captions]


def test_vtt_negative_control_parser_validates():
    body = to_vtt(JFK).removeprefix("WEBVTT\n\n")
    with pytest.raises(webvtt.errors.MalformedFileError):
        webvtt.from_string(body)


def test_vtt_escapes_markup_and_never_contains_arrow_in_text():
    segs = [seg(0, 0, 1, " a --> b <b>& c"), seg(1, 1, 2, " next")]
    out = to_vtt(segs)
    captions = list(webvtt.from_string(out))
    assert len(captions) == 2
    assert captions[0].text == "a --&gt; b &lt;b&gt;&amp; c"
    assert out.count("-->") == 2
    # Control: unescaped, the parser loses the cue text, so the escaping is what saves it.
    raw = "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\na --> b\n"
    assert [c.text for c in webvtt.from_string(raw)] != ["a --> b"]


def test_vtt_empty_input():
    assert to_vtt([]) == "WEBVTT\n\n"
    assert list(webvtt.from_string(to_vtt([]))) == []


def test_vtt_skips_empty_segments():
    segs = [seg(0, 0, 1, " "), seg(1, 1, 2, " kept")]
    assert [c.text for c in webvtt.from_string(to_vtt(segs))] == ["kept"]


# --- words and segments -----------------------------------------------------------------


def test_words_flattening():
    flat = words(JFK)
    assert len(flat) == 14
    assert flat[0] == {"word": " And", "start": 0.0, "end": 0.5, "probability": 0.9}
    assert flat[5]["word"] == " ask" and flat[5]["start"] == 3.001
    assert all(set(x) == {"word", "start", "end", "probability"} for x in flat)
    assert [x["start"] for x in flat] == sorted(x["start"] for x in flat)
    assert words([seg(0, 0, 1, " x", None)]) == []
    assert words([]) == []


def test_segments_public_rounds_and_omits_words():
    odd = seg(7, 1.23456, 2.0004999, " hi", [w(" hi", 1.23456, 2.0004999, 0.5)])
    plain = segments_public([odd], include_words=False)
    assert plain == [
        {
            "id": 7,
            "seek": 21000,
            "start": 1.235,
            "end": 2.0,
            "text": " hi",
            "tokens": [50364, 407, 50514],
            "temperature": 0.0,
            "avg_logprob": -0.25,
            "compression_ratio": 1.3,
            "no_speech_prob": 0.01,
        }
    ]
    with_words = segments_public([odd, seg(8, 2, 3, " no words")], include_words=True)
    assert with_words[0]["words"] == [
        {"word": " hi", "start": 1.235, "end": 2.0, "probability": 0.5}
    ]
    assert with_words[1]["words"] == []
    json.dumps(with_words)  # JSON-ready


# --- verbose_json -----------------------------------------------------------------------


def test_verbose_json_matches_openai_field_names():
    body = to_verbose_json(
        JFK, language="en", duration=11.0, task="transcribe", include_words=False
    )
    assert set(body) == OPENAI_VERBOSE_KEYS
    assert body["task"] == "transcribe"
    assert body["language"] == "english"
    assert body["duration"] == 11.0
    assert body["text"] == to_text(JFK)
    assert all(set(s) == OPENAI_SEGMENT_KEYS for s in body["segments"])
    assert [s["id"] for s in body["segments"]] == [1, 2, 3]
    assert body["segments"][1]["start"] == 3.001
    json.dumps(body)


def test_verbose_json_words_are_openai_shape():
    body = to_verbose_json(JFK, language="de", duration=11.0, task="transcribe", include_words=True)
    assert set(body) == OPENAI_VERBOSE_KEYS | {"words"}
    assert body["language"] == "german"
    assert all(set(x) == OPENAI_WORD_KEYS for x in body["words"])
    assert body["words"][0] == {"word": "And", "start": 0.0, "end": 0.5}


def test_verbose_json_translate_reports_output_language():
    body = to_verbose_json(JFK, language="de", duration=1.0, task="translate", include_words=False)
    assert body["task"] == "translate"
    assert body["language"] == "english"
    with pytest.raises(ValueError):
        to_verbose_json(JFK, language="en", duration=1.0, task="summarize", include_words=False)


def test_language_name():
    assert language_name("en") == "english"
    assert language_name("DE") == "german"
    assert language_name("yue") == "cantonese"
    assert language_name("ht") == "haitian creole"
    assert language_name("xx") == "xx"
    assert len(formats.LANGUAGES) == 100
    assert all(v == v.lower() for v in formats.LANGUAGES.values())


def test_language_table_matches_faster_whisper():
    # Guards the table against drift from the library's own list of language codes.
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    assert set(formats.LANGUAGES) == set(_LANGUAGE_CODES)


def test_numpy_scalars_become_plain_json_numbers():
    # faster-whisper hands out numpy float64 segment times and word probabilities.
    import numpy as np

    s = seg(
        0,
        np.float64(1.001),
        np.float64(2.5),
        " x",
        [w(" x", np.float64(1.001), np.float32(2.5), np.float32(0.75))],
    )
    out = render(list(FORMATS), [s], language="en", duration=np.float64(2.5), task="transcribe")
    text = json.dumps(out)
    assert "np." not in text
    assert out["segments"][0]["start"] == 1.001 and type(out["segments"][0]["start"]) is float
    assert out["words"][0] == {"word": " x", "start": 1.001, "end": 2.5, "probability": 0.75}
    assert "00:00:01,001 --> 00:00:02,500" in out["srt"]


# --- render -----------------------------------------------------------------------------


def test_render_several_outputs():
    out = render(
        ["text", "segments", "words", "srt", "vtt", "verbose_json"],
        JFK,
        language="en",
        duration=11.0,
        task="transcribe",
    )
    # Every format but the two a diarized job adds (tests/test_diarization.py).
    assert list(out) == [f for f in FORMATS if f not in ("diarized_json", "rttm")]
    assert out["text"] == to_text(JFK)
    assert all("words" in s for s in out["segments"])  # "words" was requested
    assert out["words"] == words(JFK)
    assert out["srt"] == to_srt(JFK)
    assert out["vtt"] == to_vtt(JFK)
    assert set(out["verbose_json"]) == OPENAI_VERBOSE_KEYS | {"words"}
    json.dumps(out)


def test_render_subset_and_word_inclusion_rules():
    out = render(["segments", "verbose_json"], JFK, language="en", duration=11.0, task="transcribe")
    assert set(out) == {"segments", "verbose_json"}
    assert all("words" not in s for s in out["segments"])
    # Segments carry words, so verbose_json includes them even though "words" was not asked.
    assert "words" in out["verbose_json"]
    no_words = [dict(s, words=None) for s in JFK]
    out = render(
        ["verbose_json", "text", "text"], no_words, language="en", duration=11.0, task="transcribe"
    )
    assert list(out) == ["verbose_json", "text"]
    assert "words" not in out["verbose_json"]


def test_render_rejects_unknown_format():
    with pytest.raises(ValueError, match="json"):
        render(["json"], JFK, language="en", duration=1.0, task="transcribe")


def test_render_empty_segments():
    out = render(list(FORMATS), [], language="en", duration=0.0, task="transcribe")
    assert out["text"] == "" and out["srt"] == "" and out["vtt"] == "WEBVTT\n\n"
    assert out["segments"] == [] and out["words"] == []
    assert out["verbose_json"]["segments"] == [] and out["verbose_json"]["words"] == []


# --- cues from word timestamps (model tier: real speech) -----------------------------


@pytest.mark.model
@pytest.mark.parametrize("batch", [1, 8])
def test_subtitle_cues_keep_the_layout_limits_on_real_speech(worker, batch) -> None:
    import base64
    import io

    import srt as srt_lib
    import webvtt

    from handler.pipeline.job import run_job
    from speech_assets.clips import long_clip

    clip = long_clip(60)
    job = {
        "audio_base64": base64.b64encode(clip.wav_bytes()).decode(),
        "batch_size": batch,
        "output": ["srt", "vtt", "segments"],
        "max_line_width": 32,
    }
    out = run_job(job, worker)
    cues = list(srt_lib.parse(out["srt"]))
    assert len(cues) >= 8
    for cue in cues:
        lines = cue.content.split("\n")
        assert len(lines) <= 2, cue
        assert all(len(line) <= 32 or " " not in line for line in lines), cue
        assert (cue.end - cue.start).total_seconds() <= 7.0 + 1e-6, cue
    vtt = list(webvtt.from_buffer(io.StringIO(out["vtt"])))
    assert [c.text for c in vtt] == [c.content for c in cues]
    # Words were computed for the cues but not asked for: the segments stay as they were.
    assert "words" not in out["segments"][0]
    assert "-sposed" not in out["srt"].replace("old-sposed", "")  # continuations stay attached


def test_speech_no_segment_covers_is_named_where_it_is() -> None:
    """12 s of speech in the middle of a conversation got no segment and nothing
    said so. The VAD's spans against the segments' times: a stretch of 3 s or more is
    named (with where), small slack at the edges and short gaps are not."""
    from handler.output import coverage

    speech = [(0.0, 10.0), (10.5, 20.0), (60.7, 66.0), (66.4, 74.3), (80.0, 90.0)]
    segs = [{"start": 0.2, "end": 19.8}, {"start": 80.1, "end": 89.7}]
    found = coverage.uncovered(speech, segs)  # type: ignore[arg-type]
    assert len(found) == 1 and found[0][:2] == (60.7, 74.3)
    assert round(found[0][2], 1) == 13.2  # 5.3 + 7.9 s of speech
    text = coverage.warning(speech, segs, multi=False)  # type: ignore[arg-type]
    assert text is not None and "60.7-74.3 s" in text and '"language": "multi"' in text
    assert coverage.warning(speech[:2], segs, multi=False) is None  # type: ignore[arg-type]
    assert coverage.warning([(0.0, 2.5)], [], multi=True) is None  # under the bound
    assert "multi" not in (coverage.warning(speech, [], multi=True) or "")
