"""AssemblyAI's answer shapes from a job's status and result: the transcript object, its
sentences, its paragraphs and its subtitles. Times are milliseconds, speakers ``A``, ``B``,
... in the order they first speak, each word's ``confidence`` Whisper's probability."""

from __future__ import annotations

import datetime
import re
from typing import Any

from handler.faces.deepgram.shape import whole_words
from handler.output import sentences as grouping
from handler.output.cues import Layout
from handler.output.formats import plain, respell, to_srt, to_vtt

STATUS = {
    "IN_QUEUE": "queued",
    "IN_PROGRESS": "processing",
    "COMPLETED": "completed",
    "FAILED": "error",
    "CANCELLED": "error",
    "TIMED_OUT": "error",
}


def _ms(seconds: Any) -> int:
    return max(0, round(float(seconds) * 1000))


def letters(result: dict[str, Any]) -> dict[str, str]:
    """The job's speaker labels as AssemblyAI's: ``A``, ``B``, ... by first word."""
    names: dict[str, str] = {}
    for w in result.get("words") or []:
        label = w.get("speaker")
        if label is not None and str(label) not in names:
            n = len(names)
            names[str(label)] = chr(ord("A") + n) if n < 26 else f"S{n + 1}"
    return names


def words_of(
    raw: list[dict[str, Any]], names: dict[str, str], spelling: dict[str, str]
) -> list[dict[str, Any]]:
    """A job's words as AssemblyAI's (whole words as the text spells them); a
    ``multichannel`` job's say their ``channel``, from 1, and it is their speaker."""
    out = []
    for w in whole_words(raw):
        label = w.get("speaker")
        word = {
            "text": respell(w["word"].strip(), spelling),
            "start": _ms(w["start"]),
            "end": _ms(w["end"]),
            "confidence": round(float(w.get("probability", 0.0)), 4),
            "speaker": None if label is None else names.get(str(label)),
        }
        if w.get("channel") is not None:
            word["channel"] = word["speaker"] = str(int(w["channel"]) + 1)
        out.append(word)
    return out


def _confidence(words: list[dict[str, Any]]) -> float:
    return round(sum(w["confidence"] for w in words) / len(words), 4) if words else 0.0


def _span(words: list[dict[str, Any]], speaker: bool = True) -> dict[str, Any]:
    out = {
        "text": " ".join(w["text"] for w in words),
        "start": words[0]["start"],
        "end": words[-1]["end"],
        "confidence": _confidence(words),
        "words": words,
    }
    if speaker:
        out["speaker"] = words[0]["speaker"]
    if "channel" in words[0]:
        out["channel"] = words[0]["channel"]
    return out


def utterances(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of words by one speaker."""
    runs: list[list[dict[str, Any]]] = []
    for w in words:
        if runs and runs[-1][-1]["speaker"] == w["speaker"]:
            runs[-1].append(w)
        else:
            runs.append([w])
    return [_span(run) for run in runs]


def sentences(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Words cut after each one that ends a sentence, and where the speaker changes."""
    return [_span(run) for run in grouping.sentences(words, "text")]


def paragraphs(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sentences joined until a pause of PARAGRAPH_PAUSE_S or another speaker."""
    runs = grouping.sentences(words, "text")
    groups = grouping.paragraphs(runs, grouping.PARAGRAPH_PAUSE_S * 1000)
    return [_span([w for run in group for w in run]) for group in groups]


def _webhook_code(report: Any) -> int | None:
    """The HTTP status the webhook's receiver last answered, as far as the report says."""
    if not isinstance(report, dict):
        return None
    if report.get("status") == "delivered":
        return 200
    last = str(report.get("last", ""))
    return int(last[5:]) if last.startswith("HTTP ") and last[5:].isdigit() else None


def transcript(
    job_id: str,
    status: dict[str, Any],
    echo: dict[str, Any],
) -> dict[str, Any]:
    """The transcript object for a job's RunPod status object and the request's echo (its
    options, and ``speech_model_used`` and ``created`` noted when it was made)."""
    state = STATUS.get(status.get("status", ""), "queued")
    obj: dict[str, Any] = {
        "id": job_id,
        "status": state,
        "audio_url": echo.get("audio_url", ""),
        "punctuate": echo.get("punctuate", True),
        "format_text": echo.get("format_text", True),
        "speaker_labels": bool(echo.get("speaker_labels")),
        "language_detection": bool(echo.get("language_detection")),
        "speech_model": None,
        "speech_model_used": echo.get("speech_model_used", "whisper"),
        "webhook_url": None,
        "text": None,
        "words": None,
        "utterances": None,
        "confidence": None,
        "audio_duration": None,
        "error": None,
    }
    echo = {k: v for k, v in echo.items() if k != "created"}  # the list's, not the object's
    obj.update({k: v for k, v in echo.items() if k not in obj or obj[k] is None})
    if echo.get("webhook_url"):
        obj["webhook_auth"] = bool(echo.get("webhook_auth_header_name"))
        obj["webhook_status_code"] = _webhook_code(status.get("webhook"))
    obj["speech_model"] = None  # AssemblyAI's enum: the model used is speech_model_used
    output = status.get("output")
    if state == "error":
        obj["error"] = status.get("error") or f"the job was {status.get('status', '').lower()}"
        if isinstance(output, dict) and output.get("error_code"):
            obj["error_code"] = output["error_code"]
    elif state == "completed" and isinstance(output, dict):
        obj.update(completed(output, echo))
    return obj


def list_item(
    job_id: str, status: dict[str, Any], echo: dict[str, Any], base: str
) -> dict[str, Any]:
    """A transcript as ``GET /v2/transcript`` lists it."""
    state = STATUS.get(status.get("status", ""), "queued")
    created = echo.get("created", "")
    done = None
    if state == "completed" and created and "executionTime" in status:
        spent_ms = status.get("delayTime", 0) + status["executionTime"]
        at = datetime.datetime.fromisoformat(created) + datetime.timedelta(milliseconds=spent_ms)
        done = at.isoformat()
    return {
        "id": job_id,
        "resource_url": f"{base}/v2/transcript/{job_id}",
        "status": state,
        "created": created,
        "completed": done,
        "audio_url": echo.get("audio_url", ""),
        "error": status.get("error") if state == "error" else None,
    }


_MASKED_NUMBER = re.compile(r"(?<![\w*])\*+")


def sub(text: str) -> str:
    """Masked numbers (``*``) as AssemblyAI's ``hash`` substitution writes them (``#``)."""
    return _MASKED_NUMBER.sub(lambda m: "#" * len(m.group()), text)


def hashed(result: dict[str, Any]) -> dict[str, Any]:
    """A result redacted (``redact_pii``, AssemblyAI's default ``hash`` substitution) with its
    masked numbers written as AssemblyAI writes them, ``#`` for each character (the job
    writes ``*``; a profane word keeps its first letter, so a run of ``*`` after no letter
    is a number's): its text, words and segments."""

    def words(raw: Any) -> Any:
        return [{**w, "word": sub(w["word"])} for w in raw] if raw else raw

    out = {**result, "text": sub(str(result.get("text", "")))}
    out["words"] = words(result.get("words"))
    out["segments"] = [
        {**seg, "text": sub(seg["text"]), "words": words(seg.get("words"))}
        for seg in result.get("segments") or []
    ]
    return out


def completed(result: dict[str, Any], echo: dict[str, Any]) -> dict[str, Any]:
    """The fields a completed transcript adds."""
    from handler.faces.assemblyai.request import spelling

    if echo.get("redact_pii"):
        result = hashed(result)
    spell = spelling(echo.get("custom_spelling"))
    words = words_of(result.get("words") or [], letters(result), spell)
    text = " ".join(w["text"] for w in words) if spell else str(result.get("text", ""))
    out: dict[str, Any] = {
        "text": text,
        "words": words,
        "confidence": _confidence(words),
        "audio_duration": round(float(result.get("duration") or 0.0)),
        "language_code": result.get("language") or echo.get("language_code"),
    }
    if echo.get("language_detection"):
        out["language_confidence"] = result.get("language_probability")
    if echo.get("speaker_labels") or "channels" in result:
        out["utterances"] = utterances(words)
    if "channels" in result:
        out["audio_channels"] = len(result["channels"])
    if result.get("warnings"):
        out["metadata"] = {"warnings": [{"message": str(w)} for w in result["warnings"]]}
    return out


def subtitles(
    result: dict[str, Any],
    kind: str,
    chars_per_caption: int | None,
    spelling: dict[str, str] | None = None,
) -> str:
    """SRT or WebVTT of a completed job, each caption at most ``chars_per_caption`` wide,
    ``custom_spelling`` applied."""
    layout = Layout() if chars_per_caption is None else Layout(chars_per_caption, 1)
    segments: list[Any] = []
    for seg in result.get("segments") or []:
        words = [
            {
                **w,
                "word": w["word"].replace(
                    w["word"].strip(), respell(w["word"].strip(), spelling or {}), 1
                ),
            }
            for w in seg.get("words") or []
        ]
        text = "".join(w["word"] for w in words) if words and spelling else seg["text"]
        # AssemblyAI's captions name no speaker (nor channel).
        words = [{**w, "speaker": None, "channel": None} for w in words]
        segments.append({**seg, "words": words, "text": text, "speaker": None, "channel": None})
    return to_srt(segments, layout=layout) if kind == "srt" else to_vtt(segments, layout=layout)


MAX_SEARCH_TERMS = 100
"""``word-search`` keywords at most (each a word, a number or a phrase of up to 5 words)."""
MAX_SEARCH_WORDS = 5


def search_terms(query: str | None) -> list[list[str]]:
    """``word-search``'s ``words`` (comma-separated) as each keyword's plain words; raises
    ValueError with the reason for a query that can never be answered."""
    split = [[plain(w) for w in k.split() if plain(w)] for k in (query or "").split(",")]
    terms = [list(t) for t in dict.fromkeys(tuple(t) for t in split if t)]
    if not terms:
        raise ValueError("words: the keywords to search for, separated by commas")
    if len(terms) > MAX_SEARCH_TERMS:
        raise ValueError(f"words: at most {MAX_SEARCH_TERMS} keywords")
    if any(len(t) > MAX_SEARCH_WORDS for t in terms):
        raise ValueError(f"words: a keyword is a phrase of at most {MAX_SEARCH_WORDS} words")
    return terms


def word_search(words: list[dict[str, Any]], terms: list[list[str]]) -> dict[str, Any]:
    """AssemblyAI's word search over a transcript's words: each keyword's matches (case and
    punctuation aside), their [start, end] in ms and the index of their first word."""
    spoken = [plain(w["text"]) for w in words]
    matches = []
    for term, at in zip(terms, grouping.find_phrases(spoken, terms), strict=True):
        n = len(term)
        matches.append(
            {
                "text": " ".join(term),
                "count": len(at),
                "timestamps": [[words[i]["start"], words[i + n - 1]["end"]] for i in at],
                "indexes": at,
            }
        )
    return {"total_count": sum(m["count"] for m in matches), "matches": matches}
