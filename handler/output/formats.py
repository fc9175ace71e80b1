"""Output formats for a finished transcription: text, segments, words, SRT, WebVTT, verbose_json.

Pure functions over plain segment dicts (built from faster-whisper's Segment namedtuples);
no model import and no I/O, so every format is testable with real parsers and no model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from handler.contract import OUTPUT_FORMATS, SEGMENT_FIELDS, Segment
from handler.output import speakers
from handler.output.cues import Layout, label, word_cues

FORMATS = OUTPUT_FORMATS

# Whisper's own code -> name table (the 100 languages its multilingual checkpoints know,
# "yue" added with large-v3). OpenAI's verbose_json reports these lowercase names.
LANGUAGES: dict[str, str] = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
    "pt": "portuguese",
    "tr": "turkish",
    "pl": "polish",
    "ca": "catalan",
    "nl": "dutch",
    "ar": "arabic",
    "sv": "swedish",
    "it": "italian",
    "id": "indonesian",
    "hi": "hindi",
    "fi": "finnish",
    "vi": "vietnamese",
    "he": "hebrew",
    "uk": "ukrainian",
    "el": "greek",
    "ms": "malay",
    "cs": "czech",
    "ro": "romanian",
    "da": "danish",
    "hu": "hungarian",
    "ta": "tamil",
    "no": "norwegian",
    "th": "thai",
    "ur": "urdu",
    "hr": "croatian",
    "bg": "bulgarian",
    "lt": "lithuanian",
    "la": "latin",
    "mi": "maori",
    "ml": "malayalam",
    "cy": "welsh",
    "sk": "slovak",
    "te": "telugu",
    "fa": "persian",
    "lv": "latvian",
    "bn": "bengali",
    "sr": "serbian",
    "az": "azerbaijani",
    "sl": "slovenian",
    "kn": "kannada",
    "et": "estonian",
    "mk": "macedonian",
    "br": "breton",
    "eu": "basque",
    "is": "icelandic",
    "hy": "armenian",
    "ne": "nepali",
    "mn": "mongolian",
    "bs": "bosnian",
    "kk": "kazakh",
    "sq": "albanian",
    "sw": "swahili",
    "gl": "galician",
    "mr": "marathi",
    "pa": "punjabi",
    "si": "sinhala",
    "km": "khmer",
    "sn": "shona",
    "yo": "yoruba",
    "so": "somali",
    "af": "afrikaans",
    "oc": "occitan",
    "ka": "georgian",
    "be": "belarusian",
    "tg": "tajik",
    "sd": "sindhi",
    "gu": "gujarati",
    "am": "amharic",
    "yi": "yiddish",
    "lo": "lao",
    "uz": "uzbek",
    "fo": "faroese",
    "ht": "haitian creole",
    "ps": "pashto",
    "tk": "turkmen",
    "nn": "nynorsk",
    "mt": "maltese",
    "sa": "sanskrit",
    "lb": "luxembourgish",
    "my": "myanmar",
    "bo": "tibetan",
    "tl": "tagalog",
    "mg": "malagasy",
    "as": "assamese",
    "tt": "tatar",
    "haw": "hawaiian",
    "ln": "lingala",
    "ha": "hausa",
    "ba": "bashkir",
    "jw": "javanese",
    "su": "sundanese",
    "yue": "cantonese",
}

_WHITESPACE = re.compile(r"\s+")


def language_name(code: str) -> str:
    """Whisper's lowercase English name for an ISO code ("de" -> "german"); else the input."""
    return LANGUAGES.get(code.strip().lower(), code)


def _to_ms(seconds: float) -> int:
    """Whole milliseconds, half-up on the decimal value the float prints as.

    Rounding the shortest decimal repr (not the binary float) makes 1.001 -> 1001 and
    59.9995 -> 60000, where float arithmetic gives 1000.999... and banker's rounding.
    """
    seconds = float(seconds)
    if not math.isfinite(seconds):
        raise ValueError(f"timestamp must be a finite number, got {seconds!r}")
    if seconds <= 0:
        return 0
    scaled = seconds * 1000
    if abs(scaled - math.floor(scaled) - 0.5) > 1e-4:
        # Far from a tie: the float error cannot change the result, skip the slow path.
        return math.floor(scaled + 0.5)
    return int(Decimal(repr(seconds)).scaleb(3).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def format_timestamp(
    seconds: float, *, decimal_marker: str = ",", always_include_hours: bool = True
) -> str:
    """HH:MM:SS,mmm (SRT) or with decimal_marker="." (WebVTT); negative clamps to zero."""
    ms = _to_ms(seconds)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    head = f"{hours:02d}:" if always_include_hours or hours else ""
    return f"{head}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def _seconds(value: float) -> float:
    """A time rounded to whole milliseconds, as a float for JSON output."""
    return _to_ms(value) / 1000


def _one_line(text: str) -> str:
    # A blank line inside a cue ends it in both SRT and WebVTT; newlines are never
    # meaningful in Whisper output, so fold every whitespace run into one space.
    return _WHITESPACE.sub(" ", text).strip()


def to_text(segments: Iterable[Segment]) -> str:
    """Segment texts, stripped, joined with single spaces."""
    return " ".join(t for t in (str(s["text"]).strip() for s in segments) if t)


def _cues(
    segments: Iterable[Segment], words_per_cue: int | None, layout: Layout | None = None
) -> list[tuple[float, float, str, str | None]]:
    """(start, end, text, speaker) per cue; empty cues dropped, end never before start.

    With a ``layout`` and words on every segment that has text, cues are built from the
    words (handler.output.cues: line width, line count, seconds on screen); otherwise one cue per
    segment, on one line. A cue never spans two speakers (a diarized job's segments are
    already split where the speaker changes).
    """
    segments = list(segments)
    spoken = [s for s in segments if str(s["text"]).strip()]
    if layout is not None and spoken and all(s.get("words") for s in spoken):
        out = []
        for start, end, text, speaker in word_cues(segments, layout):
            lines = [line for line in (_one_line(x) for x in text.split("\n")) if line]
            if lines:
                start_ms = _to_ms(start)
                end_s = max(_to_ms(end), start_ms) / 1000
                out.append((start_ms / 1000, end_s, "\n".join(lines), speaker))
        return out
    if words_per_cue is not None and words_per_cue < 1:
        raise ValueError(f"words_per_cue must be at least 1, got {words_per_cue}")
    cues: list[tuple[float, float, str, str | None]] = []
    for seg in segments:
        seg_words = seg.get("words") or []
        speaker = label(seg)
        if words_per_cue is not None and seg_words:
            for i in range(0, len(seg_words), words_per_cue):
                chunk = seg_words[i : i + words_per_cue]
                text = "".join(str(w["word"]) for w in chunk)
                cues.append((chunk[0]["start"], chunk[-1]["end"], text, speaker))
        else:
            cues.append((seg["start"], seg["end"], str(seg["text"]), speaker))
    out = []
    for start, end, text, speaker in cues:
        text = _one_line(text)
        if not text:
            continue
        start_ms = _to_ms(start)
        out.append((start_ms / 1000, max(_to_ms(end), start_ms) / 1000, text, speaker))
    return out


def _srt_safe(text: str) -> str:
    # "-->" in a cue line makes parsers read it as a timing line; loop because
    # replacing inside "--->" produces a new "-->".
    while "-->" in text:
        text = text.replace("-->", "->")
    return text


def to_srt(
    segments: Iterable[Segment], *, words_per_cue: int | None = None, layout: Layout | None = None
) -> str:
    """SubRip: cues numbered from 1; with words_per_cue, segments with words are split."""
    blocks = []
    for n, (start, end, text, speaker) in enumerate(_cues(segments, words_per_cue, layout), 1):
        if speaker:
            text = f"[{speaker}] {text}"
        blocks.append(
            f"{n}\n{format_timestamp(start)} --> {format_timestamp(end)}\n{_srt_safe(text)}\n"
        )
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    # WebVTT cue text: & and < start entities and tags; escaping > too rules out "-->".
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_vtt(segments: Iterable[Segment], *, layout: Layout | None = None) -> str:
    """WebVTT with its mandatory header; cue text escaped."""
    blocks = ["WEBVTT\n"]
    for start, end, text, speaker in _cues(segments, None, layout):
        body = _vtt_escape(text)
        if speaker:
            # A WebVTT voice span: <v name> opens the cue's text and lasts to its end.
            body = f"<v {_vtt_escape(speaker)}>{body}"
        blocks.append(
            f"{format_timestamp(start, decimal_marker='.')} --> "
            f"{format_timestamp(end, decimal_marker='.')}\n{body}\n"
        )
    return "\n".join(blocks) + ("" if len(blocks) > 1 else "\n")


def _word(w: Mapping[str, Any]) -> dict[str, Any]:
    out = {
        "word": str(w["word"]),
        "start": _seconds(w["start"]),
        "end": _seconds(w["end"]),
        "probability": float(w["probability"]),
    }
    if "speaker" in w:
        out["speaker"] = str(w["speaker"])
    if "channel" in w:
        out["channel"] = int(w["channel"])
    return out


def words(segments: Iterable[Segment]) -> list[dict[str, Any]]:
    """Every word of every segment in order, word text as faster-whisper gives it."""
    return [_word(w) for seg in segments for w in (seg.get("words") or [])]


_FIELD_TYPES: dict[str, Any] = {
    "id": int,
    "seek": int,
    "start": _seconds,
    "end": _seconds,
    "text": str,
    "tokens": lambda tokens: [int(t) for t in tokens],
    "temperature": float,
    "avg_logprob": float,
    "compression_ratio": float,
    "no_speech_prob": float,
}
assert tuple(_FIELD_TYPES) == SEGMENT_FIELDS, "contract.Segment and formats disagree"


def _segment_fields(seg: Segment) -> dict[str, Any]:
    out = {name: cast(seg[name]) for name, cast in _FIELD_TYPES.items()}  # type: ignore[literal-required]
    if "speaker" in seg:
        out["speaker"] = str(seg["speaker"])
    if "language" in seg:
        out["language"] = str(seg["language"])
    if "channel" in seg:
        out["channel"] = int(seg["channel"])
    return out


def segments_public(segments: Iterable[Segment], *, include_words: bool) -> list[dict[str, Any]]:
    """JSON-ready segment dicts; "words" (a list, empty without timestamps) only if asked."""
    out = []
    for seg in segments:
        item = _segment_fields(seg)
        if include_words:
            item["words"] = [_word(w) for w in (seg.get("words") or [])]
        out.append(item)
    return out


def to_verbose_json(
    segments: Sequence[Segment],
    *,
    language: str,
    duration: float,
    task: str,
    include_words: bool,
) -> dict[str, Any]:
    """OpenAI's verbose_json response body.

    Field names follow openai-python's TranscriptionVerbose / TranscriptionSegment /
    TranscriptionWord, plus "task", which whisper-1 returns although the typed schema
    omits it. OpenAI's words carry no probability and no leading space. For translate,
    OpenAI documents "language" as the output language, always english.
    """
    if task not in ("transcribe", "translate"):
        raise ValueError(f"task must be 'transcribe' or 'translate', got {task!r}")
    body: dict[str, Any] = {
        "task": task,
        "language": "english" if task == "translate" else language_name(language),
        "duration": _seconds(duration),
        "text": to_text(segments),
        "segments": [_segment_fields(s) for s in segments],
    }
    if include_words:
        body["words"] = [
            {"word": w["word"].strip(), "start": w["start"], "end": w["end"]}
            for w in words(segments)
        ]
    return body


def render(
    outputs: Sequence[str],
    segments: Sequence[Segment],
    *,
    language: str,
    duration: float,
    task: str,
    layout: Layout | None = None,
    turns: Sequence[speakers.TurnLike] = (),
) -> dict[str, Any]:
    """{format: value} for each requested format, in request order, duplicates once.

    ``turns``: a diarized job's speaker turns (for rttm); its segments carry ``speaker``."""
    unknown = [f for f in outputs if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown output format(s) {unknown}; valid: {', '.join(FORMATS)}")
    segments = list(segments)
    want_words = "words" in outputs
    result: dict[str, Any] = {}
    for fmt in dict.fromkeys(outputs):
        if fmt == "text":
            result[fmt] = to_text(segments)
        elif fmt == "segments":
            result[fmt] = segments_public(segments, include_words=want_words)
        elif fmt == "words":
            result[fmt] = words(segments)
        elif fmt == "srt":
            result[fmt] = to_srt(segments, layout=layout)
        elif fmt == "vtt":
            result[fmt] = to_vtt(segments, layout=layout)
        elif fmt == "diarized_json":
            result[fmt] = speakers.diarized_json(
                segments, duration=duration, text=to_text(segments)
            )
        elif fmt == "rttm":
            result[fmt] = speakers.to_rttm(turns)
        else:
            has_words = want_words or any(s.get("words") for s in segments)
            result[fmt] = to_verbose_json(
                segments,
                language=language,
                duration=duration,
                task=task,
                include_words=has_words,
            )
    return result


EDGE_PUNCTUATION = ".,!?;:\"'“”‘’«»()[]{}…¿¡-—"


def plain(word: str) -> str:
    """A word as Deepgram's ``word`` and AssemblyAI's unformatted turns give it: lower case
    without the punctuation around it ("Ask," -> "ask"; "don't" stays "don't")."""
    return word.strip().strip(EDGE_PUNCTUATION).lower()


def respell(written: str, table: dict[str, str]) -> str:
    """One word as written, rewritten when its plain form is in ``table`` (its punctuation
    kept): AssemblyAI's ``custom_spelling`` and Deepgram's ``replace``."""
    core = written.strip().strip(EDGE_PUNCTUATION)
    to = table.get(core.lower()) if table and core else None
    return written if to is None else written.replace(core, to, 1)


def whole_words(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A job's words as the transcript spells them: a piece Whisper split off a word without a
    space before it and starting with punctuation (" old" "-sposed") joins the word before
    it, so that the punctuated words, joined by spaces, are the transcript."""
    out: list[dict[str, Any]] = []
    for w in words:
        text = w["word"]
        if out and text[:1] and not text[:1].isspace() and not text[:1].isalnum():
            prev = out[-1]
            out[-1] = {
                **prev,
                "word": prev["word"] + text,
                "end": w["end"],
                "probability": min(prev.get("probability", 0.0), w.get("probability", 0.0)),
            }
        else:
            out.append(dict(w))
    return out
