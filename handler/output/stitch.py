"""The speakers of a split recording's pieces made one set for the whole (issue 33).

Each piece was diarized alone, so its "A" is whoever spoke first in it. Pieces are taken
in time order; each piece's speakers are matched one to one, most alike first, to the
speakers found so far by the cosine of their voice embeddings (each speaker's unit mean
embedding, ``speaker_embeddings``), when at least ``MATCH``; a speaker matched by nobody
is a new one. A named speaker (``known_speakers``) keeps its name. With a count given
(``num_speakers`` or ``max_speakers``), the two most alike of the whole's speakers are
merged until it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MATCH = 0.55
"""Cosine similarity from which two pieces' speakers are one person: 1 - the clustering's
cut (speaker_clusters.THRESHOLD, 0.45 cosine distance)."""


def letter(i: int) -> str:
    """A, B, ..., Z, AA, AB, ...: OpenAI's labels for unnamed speakers."""
    name = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        name = chr(65 + r) + name
    return name


@dataclass
class Voice:
    """One piece's speaker: its label there, its embedding, its seconds of speech."""

    label: str
    embedding: Sequence[float]
    seconds: float


def unify(
    pieces: Sequence[Sequence[Voice]], named: set[str], most: int | None
) -> list[dict[str, str]]:
    """Per piece, its labels -> the whole recording's labels."""
    sums: list[np.ndarray] = []
    weights: list[float] = []
    ids: list[str] = []
    maps: list[dict[str, str]] = []
    for voices in pieces:
        m: dict[str, int] = {}
        anonymous = []
        for v in voices:
            if v.label in named:
                if v.label not in ids:
                    ids.append(v.label)
                    sums.append(np.zeros(len(v.embedding)))
                    weights.append(0.0)
                m[v.label] = ids.index(v.label)
            else:
                anonymous.append(v)
        taken = set(m.values())
        pairs = sorted(((_cos(sums[g], v.embedding), g, i) for i, v in enumerate(anonymous)
                        for g in range(len(ids)) if ids[g] not in named), reverse=True)  # fmt: skip
        for sim, g, i in pairs:
            v = anonymous[i]
            if sim >= MATCH and g not in taken and v.label not in m:
                m[v.label] = g
                taken.add(g)
        for v in anonymous:
            if v.label not in m:
                ids.append("")
                sums.append(np.zeros(len(v.embedding)))
                weights.append(0.0)
                m[v.label] = len(ids) - 1
        for v in voices:
            g = m[v.label]
            sums[g] = sums[g] + np.asarray(v.embedding, dtype=np.float64) * max(v.seconds, 0.1)
            weights[g] += v.seconds
        maps.append({label: str(g) for label, g in m.items()})
    merged = _merge_to(sums, ids, named, most)
    by_root: dict[int, str] = {}
    letters: dict[int, str] = {}
    for g in range(len(ids)):  # in order of first appearance
        root = merged[g]
        if root not in by_root:
            by_root[root] = (
                ids[root]
                if ids[root] in named
                else letter(sum(1 for r in by_root if ids[r] not in named))
            )
        letters[g] = by_root[root]
    return [{label: letters[int(g)] for label, g in m.items()} for m in maps]


def _merge_to(
    sums: list[np.ndarray], ids: list[str], named: set[str], most: int | None
) -> list[int]:
    """Each speaker's root after merging the two most alike unnamed ones until ``most``."""
    root = list(range(len(ids)))
    if most is None:
        return root
    while len(set(root)) > most:
        groups = sorted(set(root))
        best = None
        for i, a in enumerate(groups):
            for b in groups[i + 1 :]:
                if ids[a] in named and ids[b] in named:
                    continue
                va = np.sum([sums[x] for x in range(len(ids)) if root[x] == a], axis=0)
                vb = np.sum([sums[x] for x in range(len(ids)) if root[x] == b], axis=0)
                sim = _cos(va, vb)
                if best is None or sim > best[0]:
                    best = (sim, a, b)
        if best is None:
            break
        _, a, b = best
        keep, gone = (b, a) if ids[b] in named else (a, b)
        root = [keep if r == gone else r for r in root]
    return root


def _cos(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y) / n if n > 0 else -1.0
