"""Group speaker embeddings into speakers: spectral clustering as 3D-Speaker does it for
CAM++ (cosine affinity, row pruning, the Laplacian's eigengap for the speaker count,
k-means on its eigenvectors, then clusters too alike merged and tiny ones absorbed).

NumPy only: scikit-learn and SciPy would add two large wheels to the image for an
eigendecomposition and a k-means of a few thousand points. Memory is bounded: at most
``MAX_POINTS`` embeddings enter the affinity matrix (a 2-hour recording has ~9,600); the
rest are assigned to the nearest centroid of the clusters found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_POINTS = 2000
PVAL = 0.012
MIN_NEIGHBOURS = 6
MERGE_COSINE = 0.8
MIN_CLUSTER = 4
DEFAULT_MAX_SPEAKERS = 8
SINGLE_SPEAKER_COSINE = 0.45


@dataclass(frozen=True)
class SpeakerCount:
    exact: int | None = None
    low: int = 1
    high: int = DEFAULT_MAX_SPEAKERS

    def clamp(self, k: int) -> int:
        if self.exact is not None:
            return self.exact
        return max(self.low, min(self.high, k))


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-8)


def cluster(embeddings: np.ndarray, count: SpeakerCount) -> np.ndarray:
    """A label 0..k-1 per embedding row."""
    n = len(embeddings)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    x = unit(embeddings.astype(np.float64))
    if n <= 2 * MIN_NEIGHBOURS:
        return _few(x, count)
    pick = np.linspace(0, n - 1, min(n, MAX_POINTS)).round().astype(np.int64)
    labels = _spectral(x[pick], count)
    labels = _tidy(x[pick], labels, count)
    if len(pick) == n:
        return labels
    return nearest(x, centroids(x[pick], labels))


def centroids(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    k = int(labels.max()) + 1
    return unit(np.stack([x[labels == i].mean(axis=0) for i in range(k)]))


def nearest(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    return np.argmax(unit(x) @ centres.T, axis=1)


def _few(x: np.ndarray, count: SpeakerCount) -> np.ndarray:
    """Too few windows for a graph: one speaker unless told or clearly not."""
    k = count.exact
    if k is None:
        k = 1 if float((x @ x.T).min()) > SINGLE_SPEAKER_COSINE else 2
        k = count.clamp(k)
    k = min(k, len(x))
    return _kmeans(x, k) if k > 1 else np.zeros(len(x), dtype=np.int64)


def _affinity(x: np.ndarray) -> np.ndarray:
    sim = x @ x.T
    n = len(sim)
    keep = max(MIN_NEIGHBOURS, int(np.ceil(PVAL * n)))
    # Zero all but each row's ``keep`` strongest affinities.
    cut = np.partition(sim, n - keep, axis=1)[:, n - keep][:, None]
    pruned = np.where(sim >= cut, sim, 0.0)
    return 0.5 * (pruned + pruned.T)


def _spectral(x: np.ndarray, count: SpeakerCount) -> np.ndarray:
    a = _affinity(x)
    np.fill_diagonal(a, 0.0)
    laplacian = np.diag(a.sum(axis=1)) - a
    values, vectors = np.linalg.eigh(laplacian)
    high = min(count.high if count.exact is None else count.exact, len(x) - 1)
    if count.exact is not None:
        k = count.exact
    else:
        gaps = np.diff(values[: high + 1])
        k = count.clamp(int(np.argmax(gaps)) + 1) if len(gaps) else 1
    k = max(1, min(k, len(x)))
    if k == 1:
        return np.zeros(len(x), dtype=np.int64)
    return _kmeans(vectors[:, :k], k)


def _kmeans(x: np.ndarray, k: int, rounds: int = 4, steps: int = 60) -> np.ndarray:
    """Lloyd's k-means, k-means++ seeding, best of ``rounds`` (a fixed seed: the same
    audio gives the same speakers)."""
    rng = np.random.default_rng(0)
    best, best_cost = np.zeros(len(x), dtype=np.int64), np.inf
    for _ in range(rounds):
        centres = _seed(x, k, rng)
        for _ in range(steps):
            d = ((x[:, None, :] - centres[None]) ** 2).sum(axis=2)
            labels = d.argmin(axis=1)
            moved = np.stack([x[labels == i].mean(0) if (labels == i).any() else centres[i]
                              for i in range(k)])  # fmt: skip
            if np.allclose(moved, centres):
                break
            centres = moved
        cost = float(d[np.arange(len(x)), labels].sum())
        if cost < best_cost:
            best, best_cost = labels, cost
    return best


def _seed(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    centres = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d = np.min([((x - c) ** 2).sum(axis=1) for c in centres], axis=0)
        total = d.sum()
        p = d / total if total > 0 else None
        centres.append(x[rng.choice(len(x), p=p)])
    return np.stack(centres)


def _tidy(x: np.ndarray, labels: np.ndarray, count: SpeakerCount) -> np.ndarray:
    """Absorb clusters of fewer than MIN_CLUSTER windows and merge clusters whose
    centroids are nearly the same voice, never going below the speakers asked for."""
    labels = _renumber(labels)
    while True:
        k = int(labels.max()) + 1
        sizes = np.bincount(labels, minlength=k)
        floor = count.exact or count.low
        if k <= max(1, floor):
            return labels
        small = [i for i in range(k) if sizes[i] < MIN_CLUSTER]
        c = centroids(x, labels)
        if small and len(small) < k:
            big = np.array([i for i in range(k) if i not in small])
            idx = np.isin(labels, small)
            labels[idx] = big[nearest(x[idx], c[big])]
        else:
            sim = c @ c.T
            np.fill_diagonal(sim, -1.0)
            i, j = np.unravel_index(int(np.argmax(sim)), sim.shape)
            if count.exact is None and sim[i, j] > MERGE_COSINE:
                labels[labels == j] = i
            else:
                return labels
        labels = _renumber(labels)


def _renumber(labels: np.ndarray) -> np.ndarray:
    _, inverse = np.unique(labels, return_inverse=True)
    return inverse.astype(np.int64)


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
