"""An AssemblyAI transcript request (``POST /v2/transcript``'s JSON) as a job of this worker.

Served: ``audio_url`` (an upload of ``/v2/upload``, or an http(s) or s3 URL fetched through
the same guard as every job's), ``language_code`` (``en_us`` is ``en``), ``language_detection``
(with ``language_codes``, the languages it may pick among), ``speaker_labels`` with
``speakers_expected`` or ``speaker_options`` (a worker with ``WHISPER_DIARIZATION``),
``word_boost`` and ``keyterms_prompt`` (Whisper's hotwords), ``prompt`` (its initial
prompt), ``temperature``, ``audio_start_from`` and ``audio_end_at`` (only that span is
transcribed), ``custom_spelling`` (applied to the words and text), ``speech_model`` (a
model loaded here by that name; any other name is the default model), and ``webhook_url``
with ``webhook_auth_header_name`` and ``_value`` (AssemblyAI's call when the transcript
ends, through the same guard and tries as every webhook), ``multichannel`` (or the older
``dual_channel``: each channel transcribed on its own). ``punctuate``,
``format_text``, ``disfluencies`` and ``boost_param`` are taken (Whisper punctuates and
formats as it transcribes). What this worker cannot do is refused with 400 and a
sentence, never ignored: the audio-intelligence features (summaries, chapters, entities,
PII redaction but of numbers, ...) and ``multichannel`` with ``speaker_labels``.
``redact_pii`` with number policies only (card numbers, security codes, expiry dates, social
security and phone numbers, number sequences) masks numbers as the job's ``redact`` does.
"""

from __future__ import annotations

import json
import re
from typing import Any

from handler.audio.netpost import check_url
from handler.errors import WorkerError
from handler.faces import webhooks

HOTWORDS = 100
TERM_CHARS = 100
"""``word_boost`` and ``keyterms_prompt``: at most this many terms each, of this many chars."""

NOT_SERVED = {
    "auto_chapters": "chapters",
    "auto_highlights": "key phrases",
    "content_safety": "content moderation",
    "entity_detection": "entity detection",
    "iab_categories": "topic detection",
    "redact_pii_audio": "PII redaction of the audio",
    "sentiment_analysis": "sentiment analysis",
    "summarization": "summaries",
}
"""Options this worker cannot serve: asked for (true), the request is refused."""

TAKEN = {
    "punctuate",
    "format_text",
    "disfluencies",
    "boost_param",
    "speech_models",
    "language_detection_options",
    "keyterms_prompt_options",
    "domain",
    "remove_audio_tags",
    "webhook_auth_header_value",
    "redact_pii_audio_quality",
    "redact_pii_audio_options",
    "redact_pii_return_unredacted",
    "summary_model",
    "summary_type",
    "content_safety_confidence",
    "speaker_options",
    "speech_understanding",
}
"""Options accepted as sent: formatting Whisper does anyway, or the settings of a feature
that is off (``summary_type`` without ``summarization``)."""

ECHOED = (
    "audio_url",
    "language_code",
    "language_detection",
    "language_codes",
    "punctuate",
    "format_text",
    "disfluencies",
    "speaker_labels",
    "speakers_expected",
    "word_boost",
    "boost_param",
    "keyterms_prompt",
    "prompt",
    "temperature",
    "audio_start_from",
    "audio_end_at",
    "custom_spelling",
    "speech_model",
    "webhook_url",
    "webhook_auth_header_name",
    "multichannel",
    "dual_channel",
    "filter_profanity",
    "redact_pii",
    "redact_pii_policies",
    "redact_pii_sub",
    "language_confidence_threshold",
    "speech_threshold",
)
"""The request's options its transcript repeats back, as AssemblyAI's does (the webhook's
header value is never repeated)."""
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
RESERVED_HEADERS = {"host", "content-length", "content-type", "transfer-encoding", "connection"}

MAX_ECHO_BYTES = 65_536
"""The request's options kept for its answers (custom_spelling, word_boost, ...), at most."""
MAX_SPELLINGS = 100
"""``custom_spelling`` entries at most (each at most 100 ``from`` words of 100 chars)."""


class Refused(Exception):
    """A request that can never succeed as sent: 400 with the reason."""


def job_for(body: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the job's input but its audio, the request's echo) for a transcript request."""
    if not isinstance(body, dict):
        raise Refused('a transcript request is a JSON object: {"audio_url": "https://..."}')
    url = body.get("audio_url")
    if not isinstance(url, str) or not url.strip():
        raise Refused("audio_url: the URL of the audio (an upload_url of /v2/upload, or https)")
    _refuse_unserved(body)
    job: dict[str, Any] = {"output": ["text", "segments", "words"], "word_timestamps": True}
    job.update(_language(body))
    job.update(_speakers(body))
    job.update(_decoding(body, loaded))
    job.update(_span(body))
    job.update(_thresholds(body))
    if _bool(body, "filter_profanity"):
        job["profanity_filter"] = True  # masked as AssemblyAI masks: "s***"
    job.update(_redaction(body))
    spelling(body.get("custom_spelling"))  # checked now: the answers apply it
    echo = {k: body[k] for k in ECHOED if body.get(k) is not None}
    if len(json.dumps(echo)) > MAX_ECHO_BYTES:  # kept beside the job for its answers
        raise Refused(f"the request's options come to over {MAX_ECHO_BYTES // 1024} KB")
    return job, echo


def _refuse_unserved(body: dict[str, Any]) -> None:
    for name, what in NOT_SERVED.items():
        if body.get(name):
            raise Refused(f"{name}: {what} is not served by this worker")
    if body.get("translation") or (body.get("speech_understanding") or {}).get("request"):
        raise Refused("speech_understanding: not served by this worker")
    unknown = sorted(set(body) - set(ECHOED) - set(NOT_SERVED) - TAKEN)
    if unknown:
        raise Refused(f"{unknown[0]}: not an option of AssemblyAI's transcript request")


NUMBER_POLICIES = frozenset(
    {
        "credit_card_number",
        "credit_card_cvv",
        "credit_card_expiration",
        "us_social_security_number",
        "phone_number",
        "number_sequence",
    }
)
"""``redact_pii_policies`` that are numbers: served by the job's ``redact`` (each run of
three numerals or more masked, handler.output.redact). The others (names, places, ...)
need a recognizer this worker has not: refused, never answered unredacted."""


def _redaction(body: dict[str, Any]) -> dict[str, Any]:
    if not _bool(body, "redact_pii"):
        return {}
    return {"redact": number_redaction(body.get("redact_pii_policies"), body.get("redact_pii_sub"))}


def number_redaction(policies: Any, sub: Any) -> list[str]:
    """The job's ``redact`` for ``redact_pii`` with these policies and substitution (files
    and streaming): numbers; Refused for a policy that is not numbers, or ``entity_name``."""
    if not (isinstance(policies, list) and policies and all(isinstance(p, str) for p in policies)):
        raise Refused("redact_pii_policies: the list of what to redact, with redact_pii")
    unserved = sorted(set(policies) - NUMBER_POLICIES)
    if unserved:
        raise Refused(
            f"redact_pii_policies: {unserved[0][:40]} is not served by this worker "
            f"(numbers are: {', '.join(sorted(NUMBER_POLICIES))})"
        )
    if sub not in (None, "hash"):
        raise Refused("redact_pii_sub: hash (each character of a number as #), not entity_name")
    return ["numbers"]


THRESHOLDS = {
    "language_confidence_threshold": "min_language_probability",
    "speech_threshold": "min_speech_ratio",
}
"""AssemblyAI's thresholds a transcript fails by, as the job's own (judged before any
decoding: LANGUAGE_UNCERTAIN, TOO_LITTLE_SPEECH); 0 is no threshold."""


def _thresholds(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, ours in THRESHOLDS.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise Refused(f"{name}: a number from 0 to 1")
        if value > 0:
            out[ours] = float(value)
    given = [name for name, ours in THRESHOLDS.items() if ours in out]
    if given and (_bool(body, "multichannel") or _bool(body, "dual_channel")):
        raise Refused(f"{given[0]}: judges one channel's recording, not with multichannel")
    span = body.get("audio_start_from") is not None or body.get("audio_end_at") is not None
    if "min_speech_ratio" in out and span:
        raise Refused("speech_threshold: judges the whole file, not with audio_start_from/end_at")
    return out


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise Refused(f"{name}: true or false")
    return value


def _int(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Refused(f"{name}: a whole number from {low} to {high}")
    return value


def language_of(code: str) -> str:
    """AssemblyAI's language code as Whisper's: ``en_us`` -> ``en``."""
    return code.split("_")[0].split("-")[0].lower()


def _language(body: dict[str, Any]) -> dict[str, Any]:
    code, detect = body.get("language_code"), _bool(body, "language_detection")
    if code is not None and (not isinstance(code, str) or not 2 <= len(code) <= 8):
        raise Refused("language_code: a language code such as en, en_us or es")
    out: dict[str, Any] = {}
    if code and not detect:
        out["language"] = language_of(code)
    codes = body.get("language_codes")
    if codes is not None:
        if not isinstance(codes, list) or not codes or len(codes) > 100:
            raise Refused("language_codes: a list of 1 to 100 language codes")
        if not all(isinstance(c, str) and 2 <= len(c) <= 8 for c in codes):
            raise Refused("language_codes: a list of language codes such as en or es")
        if detect or not code:
            out["languages"] = sorted({language_of(c) for c in codes})
    return out


def _speakers(body: dict[str, Any]) -> dict[str, Any]:
    """speaker_labels as diarize; multichannel (dual_channel) as the job's own."""
    if not _bool(body, "speaker_labels"):
        if body.get("speakers_expected") is not None:
            raise Refused("speakers_expected: with speaker_labels")
        channels = _bool(body, "multichannel") or _bool(body, "dual_channel")
        return {"multichannel": True} if channels else {}
    if _bool(body, "multichannel") or _bool(body, "dual_channel"):
        raise Refused(
            "multichannel with speaker_labels: this face labels each channel by its number "
            "(a job's diarize with multichannel, or Deepgram's, names speakers per channel)"
        )
    out: dict[str, Any] = {"diarize": True}
    expected = _int(body, "speakers_expected", 1, 20)
    if expected is not None:
        out["num_speakers"] = expected
    options = body.get("speaker_options")
    if options is not None:
        if not isinstance(options, dict):
            raise Refused("speaker_options: an object")
        low = _int(options, "min_speakers_expected", 1, 20)
        high = _int(options, "max_speakers_expected", 1, 20)
        if low is not None and expected is None:
            out["min_speakers"] = low
        if high is not None and expected is None:
            out["max_speakers"] = high
    return out


def _terms(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise Refused(f"{name}: a list of words or phrases")
    if len(value) > HOTWORDS or any(len(t) > TERM_CHARS for t in value):
        raise Refused(f"{name}: at most {HOTWORDS} terms of {TERM_CHARS} characters")
    return [t.strip() for t in value if t.strip()]


def _decoding(body: dict[str, Any], loaded: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    terms = _terms(body, "word_boost") + _terms(body, "keyterms_prompt")
    if terms:
        hotwords = ", ".join(dict.fromkeys(terms))
        if len(hotwords) > 1000:
            raise Refused("word_boost and keyterms_prompt: at most 1000 characters in all")
        out["hotwords"] = hotwords
    prompt = body.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str) or len(prompt) > 2000:
            raise Refused("prompt: text of at most 2000 characters")
        out["initial_prompt"] = prompt
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise Refused("temperature: a number from 0 to 1")
        if not 0 <= temperature <= 1:
            raise Refused("temperature: a number from 0 to 1")
        out["temperature"] = float(temperature)
    model = body.get("speech_model")
    if model is not None and not isinstance(model, str):
        raise Refused("speech_model: a model's name")
    if model in loaded:
        out["model"] = model
    return out


def _span(body: dict[str, Any]) -> dict[str, Any]:
    start = _int(body, "audio_start_from", 0, 2**31 - 1)
    end = _int(body, "audio_end_at", 1, 2**31 - 1)
    if start is None and end is None:
        return {}
    if start is not None and end is not None and end <= start:
        raise Refused("audio_end_at: after audio_start_from (both in milliseconds)")
    span = [(start or 0) / 1000]
    if end is not None:
        span.append(end / 1000)
    return {"clip_timestamps": span}


def spelling(value: Any) -> dict[str, str]:
    """``custom_spelling`` as {a word or phrase, lower case: what to write instead}."""
    if value is None:
        return {}
    if not isinstance(value, list) or len(value) > MAX_SPELLINGS:
        raise Refused(f"custom_spelling: a list of at most {MAX_SPELLINGS} {{from, to}} objects")
    out: dict[str, str] = {}
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("to"), str):
            raise Refused('custom_spelling: each is {"from": ["..."], "to": "..."}')
        sources = entry.get("from")
        if not isinstance(sources, list) or not 1 <= len(sources) <= 100:
            raise Refused('custom_spelling: "from" is a list of 1 to 100 words')
        for source in sources:
            if not isinstance(source, str) or not 0 < len(source.strip()) <= 100:
                raise Refused('custom_spelling: each "from" is a word of 1 to 100 characters')
            out[source.strip().lower()] = entry["to"][:100]
    return out


def webhook_of(body: dict[str, Any]) -> str | None:
    """The job's ``webhook`` for ``webhook_url`` (AssemblyAI's call, with the caller's
    header), or None."""
    url = body.get("webhook_url")
    if url is None:
        return None
    if not isinstance(url, str) or len(url) > 2048:
        raise Refused("webhook_url: a URL")
    try:
        check_url(url, "webhook_url")
    except WorkerError as exc:
        raise Refused(exc.message) from None
    name, value = body.get("webhook_auth_header_name"), body.get("webhook_auth_header_value")
    if (name is None) != (value is None):
        raise Refused("webhook_auth_header_name and _value: both, or neither")
    headers = {}
    if name is not None:
        if not isinstance(name, str) or not HEADER_NAME.match(name):
            raise Refused("webhook_auth_header_name: a header's name")
        if name.lower() in RESERVED_HEADERS or name.lower().startswith("x-whisper-"):
            raise Refused(f"webhook_auth_header_name: {name} is set by the worker")
        if not isinstance(value, str) or not 0 < len(value) <= 1000:
            raise Refused("webhook_auth_header_value: text of 1 to 1000 characters")
        if any(not 32 <= ord(c) < 127 for c in value):
            raise Refused("webhook_auth_header_value: printable ASCII on one line")
        headers[name] = value
    return webhooks.target(url, "assemblyai", headers)
