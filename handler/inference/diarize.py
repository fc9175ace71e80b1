"""Who spoke when, offline: speech regions -> 1.5-s windows -> CAM++ embeddings ->
agglomerative clustering -> speaker turns.

The pipeline of 3D-Speaker's CAM++ diarization recipe, run without torch: the speech
regions come from the Silero VAD faster-whisper ships, the embeddings from CAM++ exported
to ONNX at image build (builder/diarizer.py) and run by onnxruntime, the clustering is
handler.inference.speaker_clusters. Imported only when a deployment turns diarization on
(``WHISPER_DIARIZATION``): a worker without it loads none of this.

Bounds: windows are embedded ``BATCH`` at a time and only their 192-float embeddings are
kept (a 2-hour recording: ~9,600 windows, 7 MB), the clustering caps its matrix, and the
job's guard (cancel, compute budget) is checked between batches.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from handler.guard import Guard
from handler.inference import speaker_clusters, speaker_features
from handler.inference.speaker_clusters import SpeakerCount

log = logging.getLogger(__name__)

SAMPLE_RATE = speaker_features.SAMPLE_RATE
WINDOW_S = 1.5
STEP_S = 0.5
FINE_WINDOW_S = 1.0
FINE_STEP_S = 0.25
"""The second pass: shorter windows, each labelled with the nearest speaker found by the
first (a fast reply or backchannel is shorter than a 1.5-s window)."""
MIN_WINDOW_S = 0.4
BATCH = 32
VAD_CHUNK_S = 300.0
SNAP_S = 0.15
"""A change of speaker inside speech moves to the quietest 20 ms within this much of it,
when that is a pause (below PAUSE_RATIO of the two turns' median energy): people take
turns at pauses, and a window's embedding places the change only to about +-0.3 s.
Measured: the pyannote sample 0.946 -> 0.964, the built conversations unchanged
(bench/README.md, Diarization)."""
PAUSE_RATIO = 0.1
NOISY_DB = 25.0
NOISY_THRESHOLD = 0.50
"""Below NOISY_DB of speech over the noise floor, the clusters are cut at this cosine
distance instead of speaker_clusters.THRESHOLD: under noise one voice's windows lie
further apart, and a poor recording's phrases were split into speakers of their own
(bench/README.md, Under noise)."""
NAME_THRESHOLD = 0.35
"""Cosine between a cluster's centroid and a reference clip's embedding to take its name."""


@dataclass(frozen=True)
class Turn:
    start: float
    end: float
    speaker: str


@dataclass
class Diarization:
    turns: list[Turn]
    speakers: list[str]
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    snr_db: float | None = None
    """Speech over the recording's noise floor (speech_to_floor_db)."""
    centroids: dict[str, list[float]] = field(default_factory=dict)
    """Each speaker's voice: the unit mean of its windows' embeddings (what
    ``speaker_embeddings`` returns)."""


@dataclass
class Windows:
    """A recording's speech regions and windows with their voice embeddings (sample
    positions): the costly half of diarizing. A split job's pieces compute theirs and the
    whole clusters them all at once (issue 33). ``fine_emb`` None: not computed yet."""

    regions: list[tuple[int, int]]
    spans: list[tuple[int, int]]
    emb: np.ndarray
    fine: list[tuple[int, int]]
    fine_emb: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)
    noise: np.ndarray | None = None
    """The recording's noise floor, kept to embed the fine windows later (not sent)."""

    def shifted(self, offset: int) -> Windows:
        def move(xs: list[tuple[int, int]]) -> list[tuple[int, int]]:
            return [(a + offset, b + offset) for a, b in xs]

        return Windows(move(self.regions), move(self.spans), self.emb, move(self.fine),
                       self.fine_emb)  # fmt: skip

    @staticmethod
    def joined(parts: list[Windows], dim: int) -> Windows:
        """Pieces in time order (already shifted) as one recording's windows."""
        fine = [p.fine_emb if p.fine_emb is not None else np.zeros((0, dim)) for p in parts]
        return Windows(
            [r for p in parts for r in p.regions],
            [s for p in parts for s in p.spans],
            np.concatenate([p.emb.reshape(-1, dim) for p in parts]).astype(np.float32),
            [f for p in parts for f in p.fine],
            np.concatenate(fine).astype(np.float32),
        )

    def to_json(self) -> dict[str, Any]:
        """Compact: embeddings as float16 (a 4-minute piece of speech: about 0.6 MB)."""

        def pack(x: np.ndarray | None) -> str:
            x = np.zeros((0, 0)) if x is None else x
            return base64.b64encode(x.astype("<f2").tobytes()).decode()

        return {"regions": self.regions, "spans": self.spans, "fine": self.fine,
                "emb": pack(self.emb), "fine_emb": pack(self.fine_emb)}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, dim: int) -> Windows:
        """A piece's windows; ValueError when they do not hold together."""

        def spans(key: str) -> list[tuple[int, int]]:
            out = [(int(a), int(b)) for a, b in data[key]]
            if any(b < a or a < 0 for a, b in out):
                raise ValueError(f"bad {key}")
            return out

        def unpack(key: str, n: int) -> np.ndarray:
            x = np.frombuffer(base64.b64decode(data[key]), dtype="<f2").astype(np.float32)
            if x.size != n * dim:
                raise ValueError(f"{key}: {x.size} numbers for {n} windows")
            return x.reshape(n, dim)

        win, fine = spans("spans"), spans("fine")
        return cls(spans("regions"), win, unpack("emb", len(win)), fine,
                   unpack("fine_emb", len(fine)))  # fmt: skip


class Diarizer:
    """The loaded embedding model; thread-safe (onnxruntime sessions are)."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        threads: int = 0,
        device: str = "cpu",
        device_index: int = 0,
    ) -> None:
        import onnxruntime

        root = Path(model_dir)
        manifest = json.loads((root / "manifest.json").read_text())
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session, self.provider = _session(
            onnxruntime, str(root / manifest["model"]), options, device, device_index
        )
        self.embedding_size = int(manifest["embedding_size"])

    def warm_up(self) -> None:
        self.embed(np.zeros((1, 150, speaker_features.MEL_BINS), dtype=np.float32))

    def embed(self, feats: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(None, {"fbank": feats})[0])

    def clip_embedding(self, samples: np.ndarray) -> np.ndarray:
        """One embedding for a reference clip: the mean of its windows'."""
        spans = windows([(0, len(samples))])
        noise = speaker_features.noise_floor(samples)
        return speaker_clusters.unit(
            self._embed_spans(samples, spans, None, noise=noise).mean(axis=0)
        )

    def windows_of(
        self, samples: np.ndarray, guard: Guard | None = None, *, fine: bool = True
    ) -> Windows:
        """The recording's speech windows embedded (the fine ones too unless ``fine`` is
        False: a recording of one speaker never needs them)."""
        t0 = time.perf_counter()
        regions = speech_regions(samples, guard)
        spans, fine_spans = windows(regions), windows(regions, FINE_WINDOW_S, FINE_STEP_S)
        t1 = time.perf_counter()
        empty = np.zeros((0, self.embedding_size), dtype=np.float32)
        if not spans:
            return Windows(regions, [], empty, fine_spans, empty, {"vad": t1 - t0})
        noise = speaker_features.noise_floor(samples)
        emb = self._embed_spans(samples, spans, guard, noise=noise)
        fine_emb = (self._embed_spans(samples, fine_spans, guard, FINE_WINDOW_S, noise)
                    if fine else None)  # fmt: skip
        timings = {"vad": t1 - t0, "embed": time.perf_counter() - t1}
        return Windows(regions, spans, emb, fine_spans, fine_emb, timings, noise)

    def run(
        self,
        samples: np.ndarray,
        count: SpeakerCount,
        guard: Guard | None = None,
        references: dict[str, np.ndarray] | None = None,
    ) -> Diarization:
        return self.finish(samples, self.windows_of(samples, guard, fine=False), count,
                           guard, references)  # fmt: skip

    def finish(
        self,
        samples: np.ndarray,
        win: Windows,
        count: SpeakerCount,
        guard: Guard | None = None,
        references: dict[str, np.ndarray] | None = None,
    ) -> Diarization:
        """Speakers from embedded windows: cluster, relabel the fine windows, name, turns."""
        t2 = time.perf_counter()
        timings = dict(win.timings)
        if not win.spans:
            return Diarization([], [], sum(timings.values()), timings)
        emb, regions, spans = win.emb, win.regions, win.spans
        energy = frame_energy(samples)
        snr = speech_to_floor_db(energy, regions)
        cut = NOISY_THRESHOLD if snr < NOISY_DB else speaker_clusters.THRESHOLD
        labels = speaker_clusters.cluster(emb, count, cut)
        t3 = time.perf_counter()
        final = labels
        centres = speaker_clusters.centroids(speaker_clusters.unit(emb.astype(np.float64)), labels)
        if labels.max(initial=0) > 0:
            spans, final = self._relabel(samples, win, labels, centres, guard)
        names = _names(emb, labels, references or {}, order=final)
        turns = snap_changes(to_turns(spans, regions, final, names), samples, energy)
        t4 = time.perf_counter()
        speakers = list(dict.fromkeys(t.speaker for t in turns))
        timings.update({"cluster": t3 - t2, "relabel": t4 - t3})
        voices = {names[i]: [round(float(v), 5) for v in c] for i, c in enumerate(centres)}
        return Diarization(turns, speakers, sum(timings.values()), timings, round(snr, 1),
                           {s: voices[s] for s in speakers if s in voices})  # fmt: skip

    def _relabel(
        self,
        samples: np.ndarray,
        win: Windows,
        labels: np.ndarray,
        centres: np.ndarray,
        guard: Guard | None,
    ) -> tuple[list[tuple[int, int]], np.ndarray]:
        """Shorter windows, each given the speaker whose centroid it is nearest, the
        similarities averaged with the neighbouring windows' (measured: the pyannote
        sample's fast turns 0.91 -> 0.95 of the speech right; the built conversations, whose
        turns are whole phrases, 0.4 points lower: bench/README.md)."""
        fine_emb = win.fine_emb
        if fine_emb is None:
            noise = win.noise if win.noise is not None else speaker_features.noise_floor(samples)
            fine_emb = self._embed_spans(samples, win.fine, guard, FINE_WINDOW_S, noise)
        if not len(fine_emb):
            return win.spans, labels
        sim = speaker_clusters.unit(fine_emb) @ centres.T
        smooth = sim.copy()
        smooth[1:-1] = (sim[:-2] + sim[1:-1] + sim[2:]) / 3
        return win.fine, smooth.argmax(axis=1)

    def _embed_spans(
        self,
        samples: np.ndarray,
        spans: list[tuple[int, int]],
        guard: Guard | None,
        size_s: float = WINDOW_S,
        noise: np.ndarray | None = None,
    ) -> np.ndarray:
        out = np.zeros((len(spans), self.embedding_size), dtype=np.float32)
        for i in range(0, len(spans), BATCH):
            if guard is not None:
                guard.check()
            chunk = spans[i : i + BATCH]
            feats = np.stack([_window_feats(samples, s, e, size_s, noise) for s, e in chunk])
            out[i : i + len(chunk)] = self.embed(feats)
        return out


CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def _session(
    onnxruntime: Any, path: str, options: Any, device: str, device_index: int
) -> tuple[Any, str]:
    """(the session, the provider it runs on). On a CUDA worker the GPU, when this
    onnxruntime is the CUDA build (the image's ``DIARIZER_GPU=true``) and its libraries
    load; otherwise, or when they do not, the CPU, said once in the log."""
    if device == "cuda":
        if CUDA not in onnxruntime.get_available_providers():
            version = onnxruntime.__version__
            log.info("diarizer on the CPU: this onnxruntime (%s) has no CUDA provider "
                     "(an image built with DIARIZER_GPU=true has)", version)  # fmt: skip
        else:
            _preload_cuda_libraries(onnxruntime)
            providers = [(CUDA, {"device_id": device_index}), CPU]
            session = onnxruntime.InferenceSession(path, options, providers=providers)
            used = session.get_providers()[0]
            if used == CUDA:
                return session, used
            log.warning("diarizer on the CPU: onnxruntime's CUDA provider did not load "
                        "(cuDNN 9, cuFFT, cuRAND or cuBLAS 12 missing?)")  # fmt: skip
            return session, used
    return onnxruntime.InferenceSession(path, options, providers=[CPU]), CPU


def _preload_cuda_libraries(onnxruntime: Any) -> None:
    """onnxruntime-gpu >= 1.21 finds cuDNN, cuFFT and cuRAND installed from PyPI
    (nvidia-*-cu12) only through ``preload_dlls``, which prints what it cannot load: that
    goes to the log at debug level, not to stdout."""
    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is None:
        return
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            preload(cuda=True, cudnn=True)
    except Exception as exc:  # a broken install: the session's own fallback says so
        log.debug("onnxruntime.preload_dlls: %s: %s", type(exc).__name__, exc)
    if out.getvalue().strip():
        log.debug("onnxruntime.preload_dlls: %s", out.getvalue().strip()[-500:])


def _window_feats(
    samples: np.ndarray, start: int, end: int, size_s: float, noise: np.ndarray | None = None
) -> np.ndarray:
    """A window's normalized filterbanks (the recording's noise floor subtracted), short
    windows repeated to the full length."""
    clip = samples[start:end]
    want = int(size_s * SAMPLE_RATE)
    frames = speaker_features.frame_count(want)
    if len(clip) < want:
        clip = np.tile(clip, int(np.ceil(want / max(1, len(clip)))))[:want]
    return speaker_features.normalized(clip, noise)[:frames]


def speech_regions(samples: np.ndarray, guard: Guard | None = None) -> list[tuple[int, int]]:
    """(start, end) sample offsets of speech, by the Silero VAD faster-whisper ships, run
    VAD_CHUNK_S at a time (its working memory grows with the audio it is given)."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    options = VadOptions(min_silence_duration_ms=300, speech_pad_ms=100,
                         min_speech_duration_ms=200)  # fmt: skip
    chunk = int(VAD_CHUNK_S * SAMPLE_RATE)
    out: list[tuple[int, int]] = []
    for offset in range(0, len(samples), chunk):
        if guard is not None:
            guard.check()
        found = get_speech_timestamps(samples[offset : offset + chunk], options)
        out += [(offset + int(r["start"]), offset + int(r["end"])) for r in found]
    return out


def windows(
    regions: list[tuple[int, int]], size_s: float = WINDOW_S, step_s: float = STEP_S
) -> list[tuple[int, int]]:
    """Windows of ``size_s`` every ``step_s`` inside each region; the last one ends at the
    region's end; a region shorter than a window is one window (if at least MIN_WINDOW_S)."""
    size, step = int(size_s * SAMPLE_RATE), int(step_s * SAMPLE_RATE)
    out: list[tuple[int, int]] = []
    for start, end in regions:
        if end - start < MIN_WINDOW_S * SAMPLE_RATE:
            continue
        if end - start <= size:
            out.append((start, end))
            continue
        s = start
        while s + size < end:
            out.append((s, s + size))
            s += step
        out.append((max(start, end - size), end))
    return out


def to_turns(
    spans: list[tuple[int, int]],
    regions: list[tuple[int, int]],
    labels: np.ndarray,
    names: list[str],
) -> list[Turn]:
    """Each window speaks for the part of its region nearest its centre; neighbouring
    windows split their overlap at the midpoint of their centres."""
    centres = np.array([(s + e) / 2 for s, e in spans])
    turns: list[Turn] = []
    for r_start, r_end in regions:
        inside = np.nonzero((centres >= r_start) & (centres <= r_end))[0]
        if len(inside) == 0:
            continue
        pairs = zip(inside[:-1], inside[1:], strict=True)
        cuts = [r_start] + [int((centres[a] + centres[b]) / 2) for a, b in pairs] + [r_end]
        for k, idx in enumerate(inside):
            turn = Turn(cuts[k] / SAMPLE_RATE, cuts[k + 1] / SAMPLE_RATE, names[labels[idx]])
            if turns and turns[-1].speaker == turn.speaker and turn.start - turns[-1].end < 0.5:
                turns[-1] = Turn(turns[-1].start, turn.end, turn.speaker)
            elif turn.end > turn.start:
                turns.append(turn)
    return turns


def snap_changes(
    turns: list[Turn], samples: np.ndarray, energy: np.ndarray | None = None
) -> list[Turn]:
    """Each change of speaker between two adjacent turns moved to the pause nearest it
    (see SNAP_S); a change with no pause near it stays where the windows put it."""
    if len(turns) < 2:
        return turns
    if energy is None:
        energy = frame_energy(samples)
    n = len(energy)
    out = list(turns)
    for i in range(len(out) - 1):
        a, b = out[i], out[i + 1]
        if a.speaker == b.speaker or abs(a.end - b.start) > 1e-6:
            continue
        f0 = int(max(a.start + 0.1, a.end - SNAP_S) * 100)
        f1 = min(n, int(min(b.end - 0.1, b.start + SNAP_S) * 100))
        if f1 <= f0:
            continue
        quiet = f0 + int(np.argmin(energy[f0:f1]))
        around = np.median(energy[int(a.start * 100) : min(n, int(b.end * 100))])
        if energy[quiet] > PAUSE_RATIO * around:
            continue
        out[i] = Turn(a.start, quiet / 100, a.speaker)
        out[i + 1] = Turn(quiet / 100, b.end, b.speaker)
    return out


def frame_energy(samples: np.ndarray, block_s: float = 60.0) -> np.ndarray:
    """Mean square of every 10 ms, averaged over two (20 ms); computed a minute at a time
    (a float64 copy of a whole 1-hour recording would be 440 MB)."""
    hop = SAMPLE_RATE // 100
    n = len(samples) // hop
    per_block = int(block_s * 100)
    energy = np.empty(n, dtype=np.float64)
    for i in range(0, n, per_block):
        j = min(n, i + per_block)
        block = samples[i * hop : j * hop].reshape(j - i, hop).astype(np.float64)
        energy[i:j] = (block * block).mean(axis=1)
    return np.convolve(energy, np.ones(2) / 2, mode="same")


def speech_to_floor_db(energy: np.ndarray, regions: list[tuple[int, int]]) -> float:
    """How far the speech stands above the recording's noise floor, in dB: the median
    energy of the speech's 20-ms frames over the 10th percentile of all frames'. Studio
    speech with digital silence between turns: ~90 dB; the pyannote telephone call: 35;
    pink noise 15 dB under the speech: 10-12; white noise 25 dB under: 19-22."""
    hop = SAMPLE_RATE // 100
    inside = np.zeros(len(energy), dtype=bool)
    for start, end in regions:
        inside[start // hop : end // hop] = True
    if not inside.any():
        return 0.0
    floor = max(float(np.percentile(energy, 10)), 1e-12)
    return float(10 * np.log10(max(float(np.median(energy[inside])), 1e-12) / floor))


def letter(i: int) -> str:
    """A, B, ..., Z, AA, AB, ...: OpenAI's labels for unnamed speakers."""
    name = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        name = chr(65 + r) + name
    return name


def _names(
    emb: np.ndarray,
    labels: np.ndarray,
    references: dict[str, np.ndarray],
    order: np.ndarray | None = None,
) -> list[str]:
    """A name per cluster: a known speaker's when its reference clip matches, else a letter
    in order of first appearance in ``order`` (the final labels, time-ordered)."""
    k = int(labels.max()) + 1 if len(labels) else 0
    seen = labels if order is None else np.concatenate([order, labels])
    order_list = list(dict.fromkeys(int(x) for x in seen))
    named: dict[int, str] = {}
    if references:
        ref_names = list(references)
        centres = speaker_clusters.centroids(speaker_clusters.unit(emb), labels)
        refs = np.stack([references[n] for n in ref_names])
        for cluster_i, ref_j in speaker_clusters.match_names(centres, refs, NAME_THRESHOLD).items():
            named[cluster_i] = ref_names[ref_j]
    next_letter = 0
    for c in order_list:
        if c not in named:
            named[c] = letter(next_letter)
            next_letter += 1
    return [named.get(c, letter(c)) for c in range(k)]


def load(model_dir: str, threads: int = 0, device: str = "cpu", device_index: int = 0) -> Diarizer:
    t = time.perf_counter()
    diarizer = Diarizer(model_dir, threads, device, device_index)
    diarizer.warm_up()
    log.info("diarizer loaded from %s on %s in %.2fs", model_dir, diarizer.provider,
             time.perf_counter() - t)  # fmt: skip
    return diarizer
