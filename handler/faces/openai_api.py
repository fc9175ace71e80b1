"""OpenAI's audio API in terms of our job: request fields -> job input, output -> response.

Pure functions, shared by the HTTP server (``handler.faces.http_server``: multipart form fields)
and the queue worker (RunPod's OpenAI passthrough job, ``{"openai_route": ...,
"openai_input": {...}}``), so both faces validate, limit and answer alike.

What differs from OpenAI's API, and why (docs/openai.md lists every field):

- ``model``: every OpenAI transcription model name (``whisper-1``, ``gpt-4o-transcribe``,
  ``gpt-4o-mini-transcribe``, ``gpt-transcribe``, ...: ``whisper-1`` or any ``gpt-*``
  name with ``transcribe`` in it) means this worker's default model; any other name must
  be one the worker loaded.
- ``response_format=json`` answers ``{"text", "languages", "usage"}`` as OpenAI does;
  ``verbose_json`` adds our segment fields (tokens, avg_logprob, ...) as whisper-1 does.
  ``usage`` is ``{"type": "duration", "seconds": ...}``: the seconds of audio decoded.
- ``chunking_strategy`` maps to the VAD (``auto``: the default VAD; ``server_vad``: its
  ``threshold``, ``prefix_padding_ms`` as the speech padding, ``silence_duration_ms`` as the
  least silence between speech), ``keywords[]`` to ``hotwords``, ``languages[]`` to the
  languages detection may pick among.
- Fields OpenAI does not have (``vad_filter``, ``beam_size``, ``hotwords``, ``audio_url``,
  ...: what the OpenAI SDK sends through ``extra_body``) are our job options, validated by
  the same schema as a queue job.
- Speakers: ``response_format=diarized_json`` or a model name with ``diarize`` in it
  (``gpt-4o-transcribe-diarize``) turns diarization on (the worker must run with
  WHISPER_DIARIZATION); ``known_speaker_names[]`` with ``known_speaker_references[]``
  (data: URLs, or http(s) URLs) name speakers, up to 10.
- ``include[]=logprobs`` is refused (the decoder keeps one log-probability per segment,
  not per token) with INVALID_INPUT rather than silently ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from handler.audio.sources import decode_base64
from handler.contract import is_openai_model
from handler.errors import Code, WorkerError
from handler.faces.openai_errors import HTTP_STATUS, error_body, not_routed
from handler.pipeline.job import run_job
from handler.pipeline.runtime import Runtime
from handler.schema import typed_form

ROUTES = {"/v1/audio/transcriptions": "transcribe", "/v1/audio/translations": "translate"}
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
# OpenAI's own request fields; every other field is one of our job options.
OPENAI_FIELDS = frozenset(
    {
        "file",
        "model",
        "language",
        "prompt",
        "response_format",
        "temperature",
        "timestamp_granularities",
        "stream",
        "include",
        "chunking_strategy",
        "keywords",
        "languages",
        "known_speaker_names",
        "known_speaker_references",
    }
)
INCLUDES = ("logprobs",)
"""What ``include[]`` may ask: ``logprobs``, one per word (:func:`logprobs`)."""
LOGPROB_FLOOR = -100.0
"""The log-probability given a word whose probability rounds to 0 (log 0 is no number)."""
LIST_FIELDS = frozenset(
    {
        "timestamp_granularities",
        "include",
        "keywords",
        "languages",
        "known_speaker_names",
        "known_speaker_references",
    }
)
"""OpenAI's list fields: sent as ``name[]`` by the SDKs, as the same plain field repeated by
``requests`` and ``httpx`` (both fold into one list)."""
MAX_LIST_ITEMS = 100
GRANULARITIES = ("segment", "word")
MAX_FIELDS = 200
"""Form fields in one request: far more than every option, far less than a flood."""


def _bad(message: str) -> WorkerError:
    return WorkerError(Code.INVALID_INPUT, message)


def fold_form(items: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Multipart fields as one dict: ``a[]`` repeated -> list, ``a[b]`` -> nested dict.

    That is how the OpenAI SDK (and ``curl -F``) send lists and objects in a form. A value
    that is a JSON list or object is decoded too, so ``-F 'temperature=[0,0.2]'`` works.
    """
    out: dict[str, Any] = {}
    for n, (key, value) in enumerate(items):
        if n >= MAX_FIELDS:
            raise _bad(f"too many form fields (more than {MAX_FIELDS})")
        list_key = key[:-2] if key.endswith("[]") else key if key in LIST_FIELDS else None
        if list_key is not None:
            out.setdefault(list_key, [])
            if not isinstance(out[list_key], list):
                raise _bad(f"field {list_key!r} given both as a list and a value")
            if len(out[list_key]) >= MAX_LIST_ITEMS:
                raise _bad(f"{list_key}: at most {MAX_LIST_ITEMS} items")
            out[list_key].append(value)
        elif "[" in key and key.endswith("]"):
            name, _, sub = key[:-1].partition("[")
            target = out.setdefault(name, {})
            if not isinstance(target, dict):
                raise _bad(f"field {name!r} given both as an object and a value")
            target[sub] = value
        else:
            if key in out:
                raise _bad(f"field {key!r} given twice")
            text = value.strip()
            if text[:1] in "[{":
                try:
                    out[key] = json.loads(text)
                    continue
                except RecursionError:
                    raise _bad(f"field {key!r} nests too deeply") from None
                except ValueError:
                    pass
            out[key] = value
    return out


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise _bad(f"{name}: must be true or false")


def resolve_model(name: Any, loaded: list[str]) -> str | None:
    """Our model for OpenAI's ``model`` field: None (the default) for OpenAI's names."""
    if name is None or name == "":
        return None
    if not isinstance(name, str):
        raise _bad("model: must be a string")
    if name not in loaded and is_openai_model(name):
        return None
    if name not in loaded:
        raise _bad(
            f"model '{name}' is not loaded here; use whisper-1 or one of: {', '.join(loaded)}"
        )
    return name


class OpenAIRequest:
    """One transcription or translation request, turned into a job input."""

    def __init__(
        self,
        task: str,
        job_input: dict[str, Any],
        response_format: str,
        stream: bool,
        granularities: tuple[str, ...],
        logprobs: bool = False,
    ) -> None:
        self.task = task
        self.job_input = job_input
        self.response_format = response_format
        self.stream = stream
        self.granularities = granularities
        self.logprobs = logprobs


def build_request(
    route: str, fields: Mapping[str, Any], *, loaded_models: list[str], has_file: bool
) -> OpenAIRequest:
    """Validate OpenAI's fields and map them (and our extras) onto a job input.

    The audio itself is not in the result: the caller adds the upload, or ``file`` as
    base64 / a URL for a passthrough job. Raises WorkerError(INVALID_INPUT).
    """
    task = ROUTES.get(route)
    if task is None:
        raise _bad(f"unknown route {route!r}; use one of {', '.join(ROUTES)}")
    fmt, granularities = _format(fields)
    want_logprobs = _include(fields.get("include"), fmt)
    stream = _bool("stream", fields.get("stream", False))
    job: dict[str, Any] = typed_form(
        {k: v for k, v in fields.items() if k not in OPENAI_FIELDS and v is not None}
    )
    if has_file and ("audio_url" in job or "audio_base64" in job or "audio" in job):
        raise _bad("give either file or audio_url, not both")
    if task == "translate":
        if job.get("task", "translate") != "translate":
            raise _bad("the translations route only translates")
        job["task"] = "translate"
    job.update(_mapped(fields, loaded_models, has_hotwords="hotwords" in job))
    want_words = fmt == "verbose_json" and "word" in granularities
    if want_words:
        job["word_timestamps"] = True
    outputs = {
        "json": ["text"],
        "text": ["text"],
        "srt": ["srt"],
        "vtt": ["vtt"],
        "diarized_json": ["diarized_json"],
    }
    job.setdefault("output", outputs.get(fmt, ["verbose_json", *(["words"] if want_words else [])]))
    if fmt == "json" and job.get("language") == "multi" and isinstance(job["output"], list):
        job["output"] = [*job["output"], "segments"]  # each part's language, for languages
    if want_logprobs:
        _with_words(job)
    return OpenAIRequest(task, job, fmt, stream, granularities, want_logprobs)


def _include(value: Any, fmt: str) -> bool:
    """OpenAI's ``include[]``: whether ``logprobs`` is asked (only with ``json``, as OpenAI
    serves it)."""
    if value in (None, "", []):
        return False
    items = value if isinstance(value, list) else [value]
    if any(item not in INCLUDES for item in items):
        raise _bad(f"include[] takes {', '.join(INCLUDES)}")
    if fmt != "json":
        raise _bad("include[]=logprobs needs response_format=json, as OpenAI's API")
    return True


def _with_words(job: dict[str, Any]) -> None:
    """The words a ``logprobs`` answer is made of: word timestamps on, ``words`` output."""
    if job.get("word_timestamps") is False:
        raise _bad("include[]=logprobs needs word_timestamps: one log-probability per word")
    job["word_timestamps"] = True
    output = job["output"]
    if isinstance(output, list) and "words" not in output:
        job["output"] = [*output, "words"]


def _format(fields: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(response_format, timestamp granularities), checked against each other."""
    fmt = fields.get("response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise _bad(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}")
    raw_gran = fields.get("timestamp_granularities") or []
    if isinstance(raw_gran, str):
        raw_gran = [raw_gran]
    if not isinstance(raw_gran, list) or any(g not in GRANULARITIES for g in raw_gran):
        raise _bad("timestamp_granularities[] takes segment and/or word")
    if raw_gran and fmt != "verbose_json":
        raise _bad("timestamp_granularities needs response_format=verbose_json")
    return fmt, tuple(dict.fromkeys(raw_gran)) or ("segment",)


def _mapped(
    fields: Mapping[str, Any], loaded_models: list[str], *, has_hotwords: bool
) -> dict[str, Any]:
    """OpenAI's fields under our job's names."""
    job: dict[str, Any] = {}
    model = resolve_model(fields.get("model"), loaded_models)
    if model is not None:
        job["model"] = model
    if fields.get("language"):
        job["language"] = fields["language"]
    if fields.get("prompt"):
        job["initial_prompt"] = fields["prompt"]
    if fields.get("temperature") not in (None, ""):
        # A form field is text ("0.2"); a JSON list ("[0, 0.2]") was decoded by fold_form.
        job["temperature"] = typed_form({"temperature": fields["temperature"]})["temperature"]
    job.update(_chunking(fields.get("chunking_strategy")))
    keywords = _strings("keywords", fields.get("keywords"))
    if keywords:
        if has_hotwords:
            raise _bad("give either keywords[] or hotwords, not both")
        job["hotwords"] = ", ".join(keywords)
    languages = _strings("languages", fields.get("languages"))
    if languages:
        job["languages"] = languages
    job.update(_speakers(fields))
    return job


def _speakers(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``diarize`` and ``known_speakers`` from OpenAI's fields."""
    names = _strings("known_speaker_names", fields.get("known_speaker_names"))
    refs = _strings("known_speaker_references", fields.get("known_speaker_references"))
    if len(names) != len(refs):
        raise _bad("known_speaker_names[] and known_speaker_references[] must pair up")
    model = str(fields.get("model") or "").lower()
    diarize = fields.get("response_format") == "diarized_json" or "diarize" in model
    if names and not diarize:
        raise _bad("known_speaker_names[] needs a diarize model or response_format=diarized_json")
    out: dict[str, Any] = {"diarize": True} if diarize else {}
    if names:
        out["known_speakers"] = [
            {
                "name": n,
                "audio_url"
                if r.split(":", 1)[0].lower() in ("http", "https")
                else "audio_base64": r,
            }
            for n, r in zip(names, refs, strict=True)
        ]
    return out


PASSTHROUGH_KEYS = frozenset({"openai_route", "openai_input"})


def is_passthrough(raw_input: Any) -> bool:
    """RunPod's OpenAI passthrough job: ``{"openai_route": ..., "openai_input": {...}}``."""
    return isinstance(raw_input, dict) and "openai_route" in raw_input


def passthrough_request(raw_input: Mapping[str, Any], loaded_models: list[str]) -> OpenAIRequest:
    """The passthrough job as a request; ``openai_input.file`` is base64 (or a data: URI) or
    an http(s)/s3 URL. Raises WorkerError(INVALID_INPUT)."""
    extra = set(raw_input) - PASSTHROUGH_KEYS
    if extra:
        raise _bad(f"unknown field(s) beside openai_input: {sorted(extra)}")
    fields = raw_input.get("openai_input")
    if not isinstance(fields, dict):
        raise _bad("openai_input must be an object")
    fields = dict(fields)
    audio = fields.pop("file", None)
    req = build_request(
        str(raw_input["openai_route"]),
        fields,
        loaded_models=loaded_models,
        has_file=audio is not None,
    )
    if req.stream:
        raise _bad("stream: use the endpoint's /stream for a queue job")
    if audio is not None:
        if not isinstance(audio, str) or not audio:
            raise _bad("openai_input.file must be base64 or a URL")
        scheme = audio.split(":", 1)[0].lower()
        req.job_input["audio_url" if scheme in ("http", "https", "s3") else "audio_base64"] = audio
    return req


def run_any_job(
    raw_input: Any, worker: Runtime, *, body_cap: int | None = None, **options: Any
) -> Any:
    """A queue job in either shape the queue face takes: ours, or RunPod's OpenAI
    passthrough (answered with OpenAI's response body: a dict, or the text of ``text``,
    ``srt`` and ``vtt``). ``options`` are run_job's keywords.

    ``body_cap``: the job came over HTTP (the job API, an AssemblyAI upload, a Deepgram
    callback), where a body is bounded by ``WHISPER_MAX_UPLOAD_BYTES``: its
    ``audio_base64`` may decode to that much, as a file posted to the OpenAI route may
    (the queue's 15-MB inline cap refused a 20-MB upload the server had taken)."""
    if not is_passthrough(raw_input):
        if body_cap is not None and _inline_only(raw_input):
            try:
                data = decode_base64(raw_input["audio_base64"], body_cap)
            except WorkerError as exc:
                return exc.to_result()
            rest = {k: v for k, v in raw_input.items() if k != "audio_base64"}
            return run_job(rest, worker, audio=data, **options)
        return run_job(raw_input, worker, **options)
    try:
        req = passthrough_request(raw_input, worker.pool.names)
    except WorkerError as exc:
        return exc.to_result()
    result = run_job(req.job_input, worker, **options)
    if "error" in result:
        return result
    body, _media = response_body(req, result)
    return body


def _inline_only(raw_input: Any) -> bool:
    return (
        isinstance(raw_input, dict)
        and isinstance(raw_input.get("audio_base64"), str)
        and "audio_url" not in raw_input
        and "audio" not in raw_input
    )


SERVER_VAD_FIELDS = {
    "threshold": "threshold",
    "prefix_padding_ms": "speech_pad_ms",
    "silence_duration_ms": "min_silence_duration_ms",
}


def _chunking(value: Any) -> dict[str, Any]:
    """OpenAI's ``chunking_strategy`` as our VAD options."""
    if value in (None, "", "auto"):
        return {"vad_filter": True} if value == "auto" else {}
    if not isinstance(value, dict) or value.get("type") != "server_vad":
        raise _bad('chunking_strategy: "auto" or {"type": "server_vad", ...}')
    extra = set(value) - set(SERVER_VAD_FIELDS) - {"type"}
    if extra:
        raise _bad(f"chunking_strategy: unknown field(s) {sorted(extra)}")
    params = {ours: value[theirs] for theirs, ours in SERVER_VAD_FIELDS.items() if theirs in value}
    return {"vad_filter": True, "vad_parameters": params}


def _strings(name: str, value: Any) -> list[str]:
    if value in (None, "", []):
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) and v.strip() for v in items):
        raise _bad(f"{name}[]: a list of non-empty strings")
    return [v.strip() for v in items]


def languages(output: Mapping[str, Any]) -> list[dict[str, str]]:
    """OpenAI's ``languages`` (what ``gpt-transcribe`` answers, and LiveKit's OpenAI plugin
    reads as a transcript's language): each language heard, the one with the most speech
    first (with ``"language": "multi"`` each part's); empty when nothing was said."""
    share: dict[str, float] = {}
    for seg in output.get("segments") or []:
        if isinstance(seg, Mapping) and seg.get("language") and str(seg.get("text", "")).strip():
            span = max(0.0, float(seg.get("end", 0)) - float(seg.get("start", 0)))
            share[str(seg["language"])] = share.get(str(seg["language"]), 0.0) + span
    if not share and output.get("language") and str(output.get("text", "")).strip():
        share[str(output["language"])] = 1.0
    return [{"code": code} for code in sorted(share, key=lambda c: -share[c])]


def usage(output: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's duration usage: what LiteLLM and the SDKs read to price a request."""
    return {"type": "duration", "seconds": float(output.get("duration") or 0.0)}


def logprobs(words: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs``, one entry per word: Whisper's tokens are not OpenAI's (a
    client reads a confidence from them, as Pipecat averages them), so each word is a
    ``token`` (its leading space kept: the tokens spell the text), its ``logprob`` the log
    of the word's probability (the mean of its tokens' probabilities as the decoder gave
    them), and its UTF-8 ``bytes``."""
    out = []
    for word in words:
        p = float(word.get("probability") or 0.0)
        logprob = max(math.log(p), LOGPROB_FLOOR) if p > 0 else LOGPROB_FLOOR
        text = str(word.get("word") or "")
        out.append({"token": text, "logprob": round(logprob, 6), "bytes": list(text.encode())})
    return out


def response_body(req: OpenAIRequest, output: Mapping[str, Any]) -> tuple[Any, str]:
    """(body, media type) of OpenAI's response for a finished job's output."""
    fmt = req.response_format
    if fmt == "json":
        body: dict[str, Any] = {"text": output["text"]}
        if req.task == "transcribe":
            body["languages"] = languages(output)
        if req.logprobs:
            body["logprobs"] = logprobs(output.get("words") or [])
        return {**body, "usage": usage(output)}, "application/json"
    if fmt == "text":
        return output["text"] + "\n", "text/plain; charset=utf-8"
    if fmt == "srt":
        return output["srt"], "application/x-subrip; charset=utf-8"
    if fmt == "vtt":
        return output["vtt"], "text/vtt; charset=utf-8"
    if fmt == "diarized_json":
        return {**output["diarized_json"], "usage": usage(output)}, "application/json"
    verbose = dict(output["verbose_json"])
    if "segment" not in req.granularities:
        verbose.pop("segments", None)
    verbose["usage"] = usage(output)
    return verbose, "application/json"


def delta_event(delta: str, words: Any, with_logprobs: bool) -> dict[str, Any]:
    """A stream's event for one decoded segment (its words' ``logprobs`` when asked)."""
    event: dict[str, Any] = {"type": "transcript.text.delta", "delta": delta}
    if with_logprobs:
        event["logprobs"] = logprobs(words or [])
    return event


def done_event(output: Mapping[str, Any], with_logprobs: bool = False) -> dict[str, Any]:
    """The stream's last event: the whole text (every word's ``logprobs`` when asked) and
    the usage."""
    event: dict[str, Any] = {"type": "transcript.text.done", "text": output["text"]}
    event["languages"] = languages(output)
    if with_logprobs:
        event["logprobs"] = logprobs(output.get("words") or [])
    return {**event, "usage": usage(output)}


__all__ = [
    "OpenAIRequest",
    "build_request",
    "is_passthrough",
    "passthrough_request",
    "run_any_job",
    "error_body",
    "not_routed",
    "HTTP_STATUS",
    "delta_event",
    "fold_form",
    "response_body",
    "done_event",
    "usage",
    "languages",
]
