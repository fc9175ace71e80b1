"""Group speaker embeddings into speakers: agglomerative clustering, average linkage on
cosine distance, cut where clusters are farther apart than ``THRESHOLD`` (or at the
number of speakers the job gave), clusters of a few windows absorbed by the nearest
large one.

Chosen by measurement (bench/README.md, Diarization): on 20 built conversations (a
tuning set apart from the bench's) 3D-Speaker's spectral clustering got 0.72-0.90 of
the speech right, plain k-means 0.90 with the count given, this 0.99.

NumPy only, with the nearest-neighbour-chain algorithm (O(n^2) time and memory for n
windows): SciPy and scikit-learn would add two large wheels to the image for one
dendrogram. Memory is bounded: at most ``MAX_POINTS`` embeddings enter the distance
matrix (a 2-hour recording has ~9,600 windows); the rest are assigned to the nearest
centroid of the clusters found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_POINTS = 2000
THRESHOLD = 0.45
"""Average cosine distance between two clusters' windows above which they are two
speakers (tuned on a separate set of built conversations: bench/accuracy/diarization.py --seed 1).
A noisy recording is cut at diarize.NOISY_THRESHOLD instead."""
SMALL_SHARE = 0.04
MIN_WINDOWS = 4
"""A cluster with fewer windows than this (about 2 s of speech, a window every 0.5 s) or
than SMALL_SHARE of them all is absorbed by the nearest larger one: noises, laughter,
overlapped speech. 4 rather than 6 (bench/README.md, Diarization): the count exact on 18
of 20 tuning conversations instead of 17 and 17 of 20 held-out instead of 16 (a second
speaker of one short reply in a 1-minute call was absorbed at 6), one held-out
conversation split into one speaker too many."""
GIVEN_MIN_WINDOWS = 2
"""With a speaker count given, a cluster of fewer windows is an outlier, not a speaker
(cut_at_count); 2 rather than MIN_WINDOWS: a speaker of one short reply can have two."""
DEFAULT_MAX_SPEAKERS = 8


@dataclass(frozen=True)
class SpeakerCount:
    exact: int | None = None
    low: int = 1
    high: int = DEFAULT_MAX_SPEAKERS


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-8)


def cluster(
    embeddings: np.ndarray, count: SpeakerCount, threshold: float = THRESHOLD
) -> np.ndarray:
    """A label 0..k-1 per embedding row, numbered in order of first appearance;
    ``threshold`` is the cut when no count is given."""
    n = len(embeddings)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    x = unit(embeddings.astype(np.float64))
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    pick = np.linspace(0, n - 1, min(n, MAX_POINTS)).round().astype(np.int64)
    labels = _cut(x[pick], count, threshold)
    if len(pick) < n:
        labels = nearest(x, centroids(x[pick], labels))
    return _renumber(labels)


def _cut(x: np.ndarray, count: SpeakerCount, threshold: float) -> np.ndarray:
    """Cut at ``threshold``, the few-window clusters (overlapped speech and noises make such
    outliers) absorbed: the answer without a hint. A count the job gave (or bounds) only
    moves that answer to the count: when it already has that many speakers it stands (a
    hint never makes it worse); with too many, the nearest clusters are merged
    (``merge_to``); with too few, the dendrogram is cut at the count (``cut_at_count``)."""
    merges = linkage(x)
    n = len(x)
    labels = clusters_at(merges, n, threshold=threshold)
    labels = absorb_small(x, labels, max(MIN_WINDOWS, int(SMALL_SHARE * n)))
    k = int(labels.max()) + 1
    if count.exact is not None:
        want = min(count.exact, n)
    else:
        want = min(max(k, count.low), count.high, n)
    if want == k:
        return labels
    if want < k:
        return merge_to(x, labels, want)
    return split_to(x, labels, want, threshold)


def split_to(x: np.ndarray, labels: np.ndarray, k: int, threshold: float) -> np.ndarray:
    """``labels`` with clusters split until k: each time the cluster whose own dendrogram's
    top merge is farthest (the one most like two voices) is cut in two (``cut_at_count``
    within it, so a lone window is not made a speaker). The other clusters stay as they
    were: the dendrogram of the whole, cut at k, regrouped everything and on a tuning
    conversation whose fourth voice speaks only over the others turned 1.0 into 0.958."""
    labels = labels.copy()
    while int(labels.max()) + 1 < k:
        candidates: list[tuple[float, np.ndarray]] = []
        for c in range(int(labels.max()) + 1):
            rows = np.nonzero(labels == c)[0]
            if len(rows) < 2 * GIVEN_MIN_WINDOWS:
                continue
            merges = linkage(x[rows])
            halves = cut_at_count(x[rows], merges, 2, threshold)
            small = 1 if (halves == 1).sum() <= (halves == 0).sum() else 0
            candidates.append((max(m[2] for m in merges), rows[halves == small]))
        if not candidates:
            break
        # A split as far apart as two voices, the one that moves the fewest windows;
        # else the farthest apart.
        apart = [c for c in candidates if c[0] > threshold]
        best = min(apart, key=lambda c: len(c[1])) if apart else max(candidates, key=lambda c: c[0])
        labels[best[1]] = int(labels.max()) + 1
        labels = _renumber(labels)
    return labels


def merge_to(x: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """``labels`` with the two nearest clusters (average cosine distance between their
    windows, times na*nb/(na+nb)) merged, again and again, until k are left. From the
    threshold's clusters, not the dendrogram's top: a short interjection of another voice
    (2 s among three speakers, tests/test_diarization.py) is one of those clusters and
    joins the nearest speaker,
    where the dendrogram's cut at 3 kept it and merged two real speakers (0.68 of the
    speech right against 1.0 without the count)."""
    labels = labels.copy()
    dist = 1.0 - x @ x.T
    while int(labels.max()) + 1 > k:
        m = int(labels.max()) + 1
        onehot = np.eye(m)[labels]
        sizes = onehot.sum(axis=0)
        between = onehot.T @ dist @ onehot / np.outer(sizes, sizes)
        # Weighted as Ward's criterion weighs a merge: a few windows join at a small cost,
        # two large clusters (two real speakers) only when nothing else is left.
        between *= np.outer(sizes, sizes) / np.add.outer(sizes, sizes)
        np.fill_diagonal(between, np.inf)
        a, b = np.unravel_index(int(np.argmin(between)), between.shape)
        keep, gone = min(a, b), max(a, b)
        labels[labels == gone] = keep
        labels = _renumber(labels)
    return labels


def cut_at_count(
    x: np.ndarray, merges: list[tuple[int, int, float]], k: int, threshold: float
) -> np.ndarray:
    """k clusters: the dendrogram cut at k, unless one of them is a single window (an
    outlier: a cough, a laugh, two voices at once, merged last because it is like nobody);
    then the cut nearest ``threshold`` with k clusters of at least GIVEN_MIN_WINDOWS
    windows, the single windows given to the nearest. Without that, a given count spent
    one speaker on an outlier and merged two real voices (bench/README.md, Diarization)."""
    n = len(x)
    labels = clusters_at(merges, n, k=k)
    if k <= 1 or int(np.bincount(labels).min()) >= GIVEN_MIN_WINDOWS:
        return labels
    level = _level_with(merges, n, k, threshold)
    if level is None:
        return labels
    return absorb_small(x, clusters_at(merges, n, k=n - level), GIVEN_MIN_WINDOWS)


def _level_with(
    merges: list[tuple[int, int, float]], n: int, k: int, threshold: float
) -> int | None:
    """The number of merges, nearest ``threshold`` in distance, after which exactly k
    clusters have at least GIVEN_MIN_WINDOWS windows; None if no level has."""
    ordered = sorted(merges, key=lambda m: m[2])
    parent = list(range(n))
    size = [1] * n
    big = n if GIVEN_MIN_WINDOWS <= 1 else 0
    counts = [big]  # clusters of GIVEN_MIN_WINDOWS or more after m merges
    for a, b, _ in ordered:
        ra, rb = _root(parent, a), _root(parent, b)
        before = (size[ra] >= GIVEN_MIN_WINDOWS) + (size[rb] >= GIVEN_MIN_WINDOWS)
        parent[rb] = ra
        size[ra] += size[rb]
        big += (size[ra] >= GIVEN_MIN_WINDOWS) - before
        counts.append(big)
    distance = np.array([0.0] + [m[2] for m in ordered])
    for level in np.argsort(np.abs(distance - threshold), kind="stable"):
        if counts[level] == k:
            return int(level)
    return None


def _root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def linkage(x: np.ndarray) -> list[tuple[int, int, float]]:
    """Average-linkage merges (cluster a, cluster b, distance) of unit rows ``x``, by the
    nearest-neighbour chain; clusters are numbered by their first row."""
    return _chain(1.0 - x @ x.T, np.ones(len(x)))


def _chain(dist: np.ndarray, size: np.ndarray) -> list[tuple[int, int, float]]:
    n = len(dist)
    dist = dist.astype(np.float64).copy()
    size = size.astype(np.float64).copy()
    np.fill_diagonal(dist, np.inf)
    active = np.ones(n, dtype=bool)
    merges: list[tuple[int, int, float]] = []
    chain: list[int] = []
    while len(merges) < n - 1:
        if not chain:
            chain.append(int(np.argmax(active)))
        a = chain[-1]
        row = np.where(active, dist[a], np.inf)
        b = int(np.argmin(row))
        if len(chain) > 1 and row[chain[-2]] <= row[b]:
            b = chain[-2]
        if len(chain) > 1 and b == chain[-2]:
            chain.pop()
            chain.pop()
            merges.append((min(a, b), max(a, b), float(dist[a, b])))
            keep, gone = min(a, b), max(a, b)
            merged = (size[keep] * dist[keep] + size[gone] * dist[gone]) / (size[keep] + size[gone])
            dist[keep], dist[:, keep] = merged, merged
            dist[keep, keep] = np.inf
            dist[gone, :], dist[:, gone] = np.inf, np.inf
            size[keep] += size[gone]
            active[gone] = False
        else:
            chain.append(b)
    return merges


def clusters_at(
    merges: list[tuple[int, int, float]],
    n: int,
    *,
    k: int | None = None,
    threshold: float | None = None,
) -> np.ndarray:
    """Labels after the merges closer than ``threshold``, or after all but the last k-1."""
    ordered = sorted(merges, key=lambda m: m[2])
    if k is not None:
        ordered = ordered[: max(0, n - k)]
    elif threshold is not None:
        ordered = [m for m in ordered if m[2] <= threshold]
    parent = list(range(n))
    for a, b, _ in ordered:
        parent[_root(parent, b)] = _root(parent, a)
    return _renumber(np.array([_root(parent, i) for i in range(n)]))


def absorb_small(x: np.ndarray, labels: np.ndarray, min_size: int) -> np.ndarray:
    sizes = np.bincount(labels)
    big = np.nonzero(sizes >= min_size)[0]
    if len(big) == 0 or len(big) == len(sizes):
        return labels
    small = ~np.isin(labels, big)
    labels = labels.copy()
    labels[small] = big[nearest(x[small], centroids(x, labels)[big])]
    return _renumber(labels)


def centroids(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    k = int(labels.max()) + 1
    return unit(np.stack([x[labels == i].mean(axis=0) for i in range(k)]))


def nearest(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    return np.argmax(unit(x) @ centres.T, axis=1)


def _renumber(labels: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... in order of first appearance."""
    order: dict[int, int] = {}
    for v in labels.tolist():
        order.setdefault(v, len(order))
    return np.array([order[v] for v in labels.tolist()], dtype=np.int64)


def match_names(centres: np.ndarray, references: np.ndarray, threshold: float) -> dict[int, int]:
    """Cluster -> reference index, best cosine first, one-to-one, above ``threshold``."""
    sim = unit(centres) @ unit(references).T
    pairs = sorted(
        ((float(sim[i, j]), i, j) for i in range(sim.shape[0]) for j in range(sim.shape[1])),
        reverse=True,
    )
    taken: dict[int, int] = {}
    used: set[int] = set()
    for score, i, j in pairs:
        if score < threshold:
            break
        if i not in taken and j not in used:
            taken[i] = j
            used.add(j)
    return taken
