"""Fetch the model(s) an image is built for and write the manifest the worker starts from.

Runs at image build time (the Dockerfile calls it), never per job::

    python -m builder.fetch_model --model turbo --dest /models [--extra-model tiny] [--dry-run]

A faster-whisper size name or a Hugging Face repo id is fetched into a Hugging Face cache
at ``<dest>/hf``: the same layout faster-whisper reads with ``download_root`` and
``local_files_only=True``, so the worker can also load an extra model by name with the hub
offline (``WHISPER_DOWNLOAD_ROOT=<dest>/hf``). A local folder is copied to
``<dest>/local/<folder name>``. ``<dest>/manifest.json`` names the default model, the
folder it is in and a sha256 of every file in it (``WHISPER_MANIFEST``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

DEFAULT_MODEL = "turbo"
# The files faster-whisper needs to load a model without the network: tokenizer.json too,
# because without it faster-whisper fetches a tokenizer from the hub at load time.
REQUIRED_FILES = ("model.bin", "config.json", "tokenizer.json")
VOCABULARY_FILES = ("vocabulary.json", "vocabulary.txt")
# English-only Whisper vocabularies have 51864 tokens; multilingual ones 51865 (v1, v2) or
# 51866 (v3, with Cantonese). CTranslate2's is_multilingual uses the same boundary.
MULTILINGUAL_VOCAB = 51865
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

Kind = Literal["name", "repo", "local"]


class FetchError(ValueError):
    """A model request that cannot be served; the message says what would work."""


@dataclass(frozen=True)
class Source:
    requested: str
    """What the builder was asked for, as given."""
    kind: Kind
    repo_id: str | None
    """Hugging Face repo id for a name or repo id; None for a local folder."""
    local_path: Path | None
    """The folder to copy, for a local model."""

    @property
    def name(self) -> str:
        """What jobs call the model: the request, or the folder's name for a local path."""
        return self.local_path.name if self.local_path is not None else self.requested


def model_names() -> dict[str, str]:
    """faster-whisper's own table of size names and their repo ids (its single source)."""
    from faster_whisper import utils

    table = getattr(utils, "_MODELS", None)
    if not isinstance(table, dict):  # a future faster-whisper renamed its private table
        raise RuntimeError("faster_whisper.utils has no model table; update builder/")
    return {name: table[name] for name in utils.available_models()}


def resolve(model: str) -> Source:
    """Classify a request without touching the network: local folder, size name or repo id."""
    model = model.strip()
    if not model:
        raise FetchError("empty model name")
    path = Path(model).expanduser()
    if path.is_dir():
        return Source(model, "local", None, path.resolve())
    if model.startswith(("/", ".", "~")):
        raise FetchError(f"model folder {model!r} does not exist")
    names = model_names()
    if model in names:
        return Source(model, "name", names[model], None)
    if "/" in model:
        if not _REPO_ID.match(model):
            raise FetchError(f"{model!r} is neither a folder nor a Hugging Face repo id")
        return Source(model, "repo", model, None)
    raise FetchError(
        f"unknown model {model!r}: use a local folder, a Hugging Face repo id (owner/name) "
        f"or one of: {', '.join(names)}"
    )


def check_model_dir(path: Path) -> None:
    """Fail unless the folder holds everything faster-whisper loads offline."""
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if not any((path / f).is_file() for f in VOCABULARY_FILES):
        missing.append("vocabulary.json|vocabulary.txt")
    if missing:
        raise FetchError(f"{path} is not a CTranslate2 Whisper model: missing {', '.join(missing)}")


def vocabulary_size(path: Path) -> int:
    json_vocab = path / "vocabulary.json"
    if json_vocab.is_file():
        return len(json.loads(json_vocab.read_text(encoding="utf-8")))
    with open(path / "vocabulary.txt", encoding="utf-8") as fh:
        return sum(1 for _ in fh)


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def hash_files(path: Path) -> dict[str, str]:
    """sha256 of every regular file in the folder (symlinks into the HF blob store followed)."""
    return {p.name: sha256_file(p) for p in sorted(path.iterdir()) if p.is_file()}


def fetch(
    source: Source, dest: Path, *, revision: str | None = None, offline: bool = False
) -> Path:
    """Put the model under ``dest`` and return the folder that holds its files."""
    if source.kind == "local":
        assert source.local_path is not None
        check_model_dir(source.local_path)
        target = dest / "local" / source.local_path.name
        if target.resolve() != source.local_path:
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            # Copy, never link: the build context (or a mounted volume) is gone at run time.
            shutil.copytree(source.local_path, target, symlinks=False)
        return target.absolute()

    from faster_whisper.utils import download_model

    assert source.repo_id is not None
    folder = download_model(
        source.repo_id,
        cache_dir=str(dest / "hf"),
        revision=revision,
        local_files_only=offline,
    )
    path = Path(folder).absolute()
    check_model_dir(path)
    return path


def describe(source: Source, path: Path, name: str | None = None) -> dict:
    """The manifest entry of one fetched model; ``name`` overrides what jobs call it."""
    return {
        "model": name or source.name,
        "source": source.requested,
        "repo_id": source.repo_id,
        # HF cache snapshots are named after the commit they hold: the exact weights.
        "revision": path.name if source.kind != "local" else None,
        "path": str(path),
        "files": hash_files(path),
        "multilingual": vocabulary_size(path) >= MULTILINGUAL_VOCAB,
    }


def write_manifest(dest: Path, main: dict, extras: Sequence[dict]) -> Path:
    manifest = dict(main)
    manifest["extra_models"] = list(extras)
    manifest["built_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    target = dest / "manifest.json"
    # Write then rename, so a failed build never leaves half a manifest behind.
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=".manifest.", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target


def plan(source: Source, dest: Path, revision: str | None = None) -> dict:
    """What a fetch would do, for --dry-run (no network, no writes)."""
    if source.kind == "local":
        assert source.local_path is not None
        check_model_dir(source.local_path)
        where = str((dest / "local" / source.local_path.name).absolute())
    else:
        where = str((dest / "hf").absolute())
    return {
        "model": source.name,
        "kind": source.kind,
        "repo_id": source.repo_id,
        "from": str(source.local_path) if source.local_path else f"huggingface.co/{source.repo_id}",
        "into": where,
        "revision": revision,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m builder.fetch_model",
        description="Fetch the Whisper model(s) to bake into the image and write manifest.json.",
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"size name, Hugging Face repo id or local folder (default: {DEFAULT_MODEL})",
    )
    parser.add_argument("--dest", required=True, type=Path, help="folder to put models in")
    parser.add_argument(
        "--extra-model",
        action="append",
        default=[],
        metavar="MODEL",
        help="another model to bake (repeatable); jobs reach it via WHISPER_ALLOWED_MODELS",
    )
    parser.add_argument("--revision", help="Hugging Face commit or tag of --model (pin it)")
    parser.add_argument(
        "--name", help="what jobs and results call --model (default: the name, or the folder's)"
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use only what is already in <dest>/hf (never the network)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="resolve the names and print the plan only"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    dest: Path = args.dest
    requests = [args.model, *[m for m in args.extra_model if m != args.model]]
    try:
        sources = [resolve(m) for m in requests]
        if args.dry_run:
            revisions = [args.revision] + [None] * (len(sources) - 1)
            plans = [plan(s, dest, r) for s, r in zip(sources, revisions, strict=True)]
            print(json.dumps(plans, indent=2))
            return 0
        dest.mkdir(parents=True, exist_ok=True)
        entries = []
        for i, source in enumerate(sources):
            first = i == 0
            log.info("fetching %s (%s)", source.requested, source.repo_id or source.kind)
            path = fetch(
                source, dest, revision=args.revision if first else None, offline=args.offline
            )
            entries.append(describe(source, path, name=args.name if first else None))
    except FetchError as exc:
        print(f"fetch_model: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # network, disk, hub errors: one line, non-zero, build stops
        print(f"fetch_model: cannot fetch the model: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    target = write_manifest(dest, entries[0], entries[1:])
    size = sum((Path(entries[0]["path"]) / f).stat().st_size for f in entries[0]["files"])
    log.info(
        "wrote %s: %s in %s (%.0f MB)", target, entries[0]["model"], entries[0]["path"], size / 1e6
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
