"""The speech self-test: before a worker serves, every loaded model instance transcribes a
bundled clip of real speech (the first 7.7 s of JFK's inaugural address, public domain)
and must find its words. A transcript that is empty or wrong means the worker never
serves: CTranslate2's wheels can return empty text silently on a GPU whose driver cannot
JIT their kernels, and the warm-up (noise) cannot notice that.

``WHISPER_SELF_TEST_CLIP`` and ``WHISPER_SELF_TEST_TEXT`` swap the clip and its text (a
model fine-tuned for another language); ``WHISPER_SELF_TEST=false`` turns it off.

Also here: the NVIDIA driver as the host reports it (``/proc/driver/nvidia``), read
without loading CUDA, for the self-test's message and the driver floor checked at start.
"""

from __future__ import annotations

import re
import time
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from handler.inference.models import ModelLoadError

CLIP = Path(__file__).resolve().parent / "data" / "selftest_en.wav"
TEXT = "And so my fellow Americans, ask not what your country can do for you"
PASS_SHARE = 0.75
"""Share of the clip's words the transcript must contain."""
DRIVER_FLOOR = 570
"""The oldest NVIDIA driver branch the image's CUDA 12.8 runtime (CTranslate2 4.8's wheels)
starts on: R570 (NVIDIA's CUDA toolkit release notes, table 3)."""
PROC = Path("/proc/driver/nvidia")


class SelfTestFailed(ModelLoadError):
    """A model instance did not transcribe the clip; the message says which and why."""


@dataclass(frozen=True)
class Driver:
    version: str | None
    """The kernel module's version ("550.54.14"), None without an NVIDIA driver."""
    gpus: tuple[str, ...]

    @property
    def branch(self) -> int | None:
        return int(self.version.split(".")[0]) if self.version else None

    def describe(self) -> str:
        if self.version is None:
            return "no NVIDIA driver"
        return f"NVIDIA driver {self.version} ({', '.join(self.gpus) or 'no GPU listed'})"


def read_driver(proc: Path = PROC) -> Driver:
    """The driver's version and the GPUs' names from ``proc`` (``/proc/driver/nvidia``)."""
    try:
        text = (proc / "version").read_text(errors="replace")
    except OSError:
        return Driver(None, ())
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
    gpus = []
    for info in sorted((proc / "gpus").glob("*/information")):
        model = re.search(r"^Model:\s*(.+)$", info.read_text(errors="replace"), re.M)
        if model:
            gpus.append(model.group(1).strip())
    return Driver(found.group(1) if found else None, tuple(gpus))


def driver_refusal(driver: Driver) -> str | None:
    """The one sentence that refuses a driver below the floor (None: fine or none)."""
    branch = driver.branch
    if branch is None or branch >= DRIVER_FLOOR:
        return None
    return (
        f"the host's {driver.describe()} is older than this image needs (R{DRIVER_FLOOR} or "
        "newer, for CUDA 12.8): CTranslate2's kernels would not load or would answer empty. "
        f"Run it on a host with driver {DRIVER_FLOOR}+ (on RunPod: allowedCudaVersions 12.8 "
        "or newer)"
    )


def read_clip(path: str | Path | None) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV as float32 samples."""
    with wave.open(str(path or CLIP)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (16000, 1, 2):
            raise SelfTestFailed(f"the self-test clip {path} is not 16 kHz mono 16-bit WAV")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    return (pcm.astype(np.float32) / 32768.0).copy()


def words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.lower())


def share_found(expected: str, heard: str) -> float:
    """The share of ``expected``'s words that ``heard`` contains (as a multiset)."""
    want, have = words(expected), words(heard)
    left = {w: have.count(w) for w in set(have)}
    found = 0
    for w in want:
        if left.get(w, 0) > 0:
            left[w] -= 1
            found += 1
    return found / max(1, len(want))


def run(pool: Any, clip: str | None, text: str | None, compute: str) -> float:
    """Transcribe the clip on every instance of every model; SelfTestFailed on the first
    that misses. Returns the seconds it took."""
    start = time.perf_counter()
    audio = read_clip(clip)
    expected = text or TEXT
    language = None if clip else "en"
    for name, model in pool.models.items():
        for n, inst in enumerate(model.instances):
            segments, _ = inst.transcribe(
                audio, beam_size=1, language=language, vad_filter=False, without_timestamps=True
            )
            heard = " ".join(s.text for s in segments).strip()
            share = share_found(expected, heard)
            if share < PASS_SHARE:
                raise SelfTestFailed(_failure(name, n, heard, share, compute))
    return time.perf_counter() - start


def _failure(name: str, n: int, heard: str, share: float, compute: str) -> str:
    import ctranslate2

    what = "an empty transcript" if not heard else f"{share:.0%} of its words"
    return (
        f"speech self-test failed: model {name} (instance {n}) gave {what} for the bundled "
        f"speech clip, on {read_driver().describe()}, CTranslate2 {ctranslate2.__version__}, "
        f"compute type {compute}. This worker will not serve. On a GPU this is most often a "
        f"driver that cannot run CTranslate2's kernels (R{DRIVER_FLOOR}+ needed): move to "
        "another host or GPU type, or try WHISPER_COMPUTE_TYPE=float16 or int8_float16. "
        "A model fine-tuned for another language: set WHISPER_SELF_TEST_CLIP and "
        "WHISPER_SELF_TEST_TEXT"
    )
