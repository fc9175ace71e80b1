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

CT2_CUDA: tuple[tuple[tuple[int, int, int], str, int, str], ...] = (
    ((4, 6, 3), "12.8", 570, "cuda"),
    ((4, 6, 1), "12.4", 550, "cuda-r550"),
    ((4, 5, 0), "12.2", 535, "cuda-r535"),
)
"""(the first CTranslate2 release, the CUDA its Linux wheels are built with, the oldest
NVIDIA driver branch that CUDA starts on, the image variant that carries it), newest first.
The CUDA of each release: CTranslate2's ``python/tools/prepare_build_environment_linux.sh``
at its tag (v4.5.0-v4.6.0: CUDA 12.2 and cuDNN 9.1; v4.6.1-v4.6.2: 12.4; v4.6.3 on: 12.8,
and no cuDNN from v4.8). The driver for each CUDA: NVIDIA's CUDA toolkit release notes,
table 3 (12.2: 535.54.03, 12.4: 550.54.14, 12.8: 570.26). The worker refuses a driver
below the floor of the CTranslate2 it carries and names the variant that fits."""


def cuda_floor(version: str | None = None) -> tuple[str, int]:
    """(CUDA, driver branch) the installed CTranslate2 (or ``version``) needs."""
    if version is None:
        from importlib.metadata import version as installed

        version = installed("ctranslate2")
    got = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    for first, cuda, branch, _variant in CT2_CUDA:
        if got >= first:
            return cuda, branch
    return CT2_CUDA[-1][1], CT2_CUDA[-1][2]


def variant_for(branch: int) -> str | None:
    """The image variant (``WHISPER_IMAGE``) whose CTranslate2 runs on ``branch``."""
    fits = [v for _first, _cuda, floor, v in CT2_CUDA if floor <= branch]
    return fits[0] if fits else None


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


def driver_refusal(driver: Driver, ct2: str | None = None) -> str | None:
    """The one sentence that refuses a driver below the floor of the CTranslate2 this
    image carries (``ct2``: its version, else the installed one); None: fine or none."""
    branch = driver.branch
    cuda, floor = cuda_floor(ct2)
    if branch is None or branch >= floor:
        return None
    variant = variant_for(branch)
    instead = (
        f"build the image with --build-arg WHISPER_IMAGE={variant} for this driver"
        if variant
        else "no image variant here runs on it"
    )
    return (
        f"the host's {driver.describe()} is older than this image needs (R{floor} or "
        f"newer, for CUDA {cuda}): CTranslate2's kernels would not load or would answer "
        f"empty. Run it on a host with driver {floor}+ (on RunPod: allowedCudaVersions "
        f"{cuda} or newer), or {instead}"
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
        f"driver that cannot run CTranslate2's kernels (R{cuda_floor()[1]}+ needed): move to "
        "another host or GPU type, or try WHISPER_COMPUTE_TYPE=float16 or int8_float16. "
        "A model fine-tuned for another language: set WHISPER_SELF_TEST_CLIP and "
        "WHISPER_SELF_TEST_TEXT"
    )
