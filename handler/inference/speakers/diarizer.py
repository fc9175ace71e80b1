"""Who spoke when, offline: speech regions -> 1.5-s windows -> CAM++ embeddings ->
agglomerative clustering -> speaker turns.

The pipeline of 3D-Speaker's CAM++ diarization recipe, run without torch: the speech
regions come from the Silero VAD faster-whisper ships, the embeddings from CAM++ exported
to ONNX at image build (builder/diarizer.py) and run by onnxruntime, the clustering is
speakers/clusters.py. Imported only when a deployment turns diarization on
(``WHISPER_DIARIZATION``): a worker without it loads none of this.

Bounds: windows are embedded ``BATCH`` at a time and only their 192-float embeddings are
kept (a 2-hour recording: ~9,600 windows, 7 MB), the clustering caps its matrix, and the
job's guard (cancel, compute budget) is checked between batches.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from handler.contract import SAMPLE_RATE
from handler.guard import Guard
from handler.inference.speakers import clusters as speaker_clusters
from handler.inference.speakers import features as speaker_features
from handler.inference.speakers.clusters import SpeakerCount
from handler.inference.speakers.turns import (
    Diarization,
    frame_energy,
    letter,
    snap_changes,
    speech_to_floor_db,
    to_turns,
)
from handler.inference.speakers.windows import (
    WINDOW_S,
    Windows,
    speech_regions,
    windows,
)

log = logging.getLogger(__name__)


FINE_WINDOW_S = 1.0


FINE_STEP_S = 0.25
"""The second pass: shorter windows, each labelled with the nearest speaker found by the
first (a fast reply or backchannel is shorter than a 1.5-s window)."""


BATCH = 32


NOISY_DB = 25.0


NOISY_THRESHOLD = 0.50
"""Below NOISY_DB of speech over the noise floor, the clusters are cut at this cosine
distance instead of speaker_clusters.THRESHOLD: under noise one voice's windows lie
further apart, and a poor recording's phrases were split into speakers of their own
(bench/README.md, Under noise)."""


NAME_THRESHOLD = 0.75
"""Cosine between a speaker's voice and a reference clip's embedding to take its name.
Measured (``python -m bench known-speakers``, seven real voices, bench/README.md): the same
voice scores 0.62-0.95 (median 0.89-0.90), other voices 0.38-0.79 (median 0.57-0.60); at
0.75, on 25 held-out conversations, the named voice got its name 96 % of the time and a
wrong voice got it 2 % of the time (0.35 named a wrong voice half the time)."""
SAME_VOICE_PAIR = 0.75
"""With ``num_speakers`` given: two of the speakers found this alike are likely one voice
split to reach the count, said in ``warnings``. Measured: the closest pair of two real
voices 0.52-0.71; one voice forced into 2 or 4 speakers 0.69-0.91 (p5 0.79)."""
LIKELY_SAME_PAIR = 0.70
"""The same, where clustering without the count finds fewer speakers than asked (JFK's
11 s forced into two: 0.72; few windows make a voice's halves differ more)."""


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

    def clip_embedding(
        self, samples: np.ndarray, regions: list[tuple[int, int]] | None = None
    ) -> np.ndarray:
        """One embedding for a reference clip: the mean of its speech's windows' (the
        clip's speech regions: its silence or noise says nothing of the voice)."""
        regions = speech_regions(samples) if regions is None else regions
        spans = windows(regions) or windows([(0, len(samples))])
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
        fine_emb = (
            self._embed_spans(samples, fine_spans, guard, FINE_WINDOW_S, noise) if fine else None
        )
        timings = {"vad": t1 - t0, "embed": time.perf_counter() - t1}
        return Windows(regions, spans, emb, fine_spans, fine_emb, timings, noise)

    def run(
        self,
        samples: np.ndarray,
        count: SpeakerCount,
        guard: Guard | None = None,
        references: dict[str, np.ndarray] | None = None,
    ) -> Diarization:
        return self.finish(
            samples, self.windows_of(samples, guard, fine=False), count, guard, references
        )

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
        free = None
        if count.exact is not None:  # what the voices say without the count, to compare
            free = int(speaker_clusters.cluster(emb, SpeakerCount(), cut).max(initial=0)) + 1
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
        return Diarization(
            turns,
            speakers,
            sum(timings.values()),
            timings,
            round(snr, 1),
            {s: voices[s] for s in speakers if s in voices},
            _count_doubts(count, centres, speakers, names, free),
        )

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
            log.info(
                "diarizer on the CPU: this onnxruntime (%s) has no CUDA provider "
                "(an image built with DIARIZER_GPU=true has)",
                version,
            )
        else:
            _preload_cuda_libraries(onnxruntime)
            providers = [(CUDA, {"device_id": device_index}), CPU]
            session = onnxruntime.InferenceSession(path, options, providers=providers)
            used = session.get_providers()[0]
            if used == CUDA:
                return session, used
            log.warning(
                "diarizer on the CPU: onnxruntime's CUDA provider did not load "
                "(cuDNN 9, cuFFT, cuRAND or cuBLAS 12 missing?)"
            )
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


def _count_doubts(
    count: SpeakerCount,
    centres: np.ndarray,
    speakers: list[str],
    names: list[str],
    free: int | None,
) -> list[str]:
    """What a given count makes doubtful: voices split to reach it (a pair of speakers
    as alike as SAME_VOICE_PAIR, or as LIKELY_SAME_PAIR where the voices alone make fewer
    speakers than asked), or fewer speakers found than asked."""
    if count.exact is None:
        return []
    out = []
    if len(speakers) < count.exact:
        out.append(
            f"num_speakers is {count.exact}, but {len(speakers)} speaker(s) could be told apart"
        )
    x = speaker_clusters.unit(np.asarray(centres, dtype=np.float64))
    close = [
        (float(x[i] @ x[j]), names[i], names[j])
        for i in range(len(x))
        for j in range(i + 1, len(x))
        if float(x[i] @ x[j])
        >= (LIKELY_SAME_PAIR if (free or 0) < count.exact else SAME_VOICE_PAIR)
    ]
    if close:
        cos, a, b = max(close)
        out.append(
            f"num_speakers is {count.exact}, but the voices do not support it: {len(close)} "
            f"pair(s) of speakers sound like one voice (closest {a} and {b}, cosine {cos:.2f})"
        )
    return out


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
    log.info(
        "diarizer loaded from %s on %s in %.2fs",
        model_dir,
        diarizer.provider,
        time.perf_counter() - t,
    )
    return diarizer
