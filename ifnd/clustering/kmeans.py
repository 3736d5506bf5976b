"""k-means for pseudo labels: faiss (GPU if available, else CPU) or pure torch (CPU or CUDA).

Both backends follow PCL's recipe: plain (non-spherical) Lloyd iterations on L2-normalised
features, several restarts keeping the best objective, training on a seeded random sample of at
most ``k * max_points_per_centroid`` points; the centroids are then L2-normalised and every
feature is assigned to the centroid of highest cosine similarity.
"""
from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['KMeansResult', 'kmeans', 'multi_level_kmeans', 'assign_by_cosine', 'KMEANS_BACKENDS']

KMEANS_BACKENDS = ('auto', 'faiss', 'torch')
_INITS = ('random', 'k-means++')
# Upper bound on the entries of one [chunk, K] similarity block (256 MiB in float32).
_BLOCK_ELEMENTS = 1 << 26
# Seed offset between levels of multi_level_kmeans (a prime, so level seeds rarely coincide
# with the per-round seeds a caller derives from the same base).
_LEVEL_SEED_STRIDE = 1009

ArrayLike = Union[Tensor, np.ndarray]


@dataclass
class KMeansResult:
    """Result of one k-means run."""

    centroids: Tensor  # [K, D] float32, L2-normalised
    assignments: Tensor  # [N] int64, index of the most cosine-similar centroid
    objective: float  # sum_i ||x_i - c_{a_i}||^2 over all normalised features and centroids
    backend: str  # backend actually used: 'faiss' or 'torch'

    @property
    def num_clusters(self) -> int:
        """Number of centroids."""
        return int(self.centroids.shape[0])


def _to_features(features: ArrayLike) -> Tensor:
    """Float32 L2-normalised ``[N, D]`` tensor on the input's device."""
    if isinstance(features, np.ndarray):
        features = torch.from_numpy(np.ascontiguousarray(features))
    if not isinstance(features, Tensor):
        raise TypeError(f'features must be a torch.Tensor or numpy.ndarray, got {type(features)}')
    if features.ndim != 2:
        raise ValueError(f'features must be [N, D], got shape {tuple(features.shape)}')
    return F.normalize(features.detach().float(), dim=1)


def _rows_per_chunk(chunk_size: int, num_cols: int) -> int:
    return max(1, min(int(chunk_size), _BLOCK_ELEMENTS // max(1, num_cols)))


def _assign_with_similarity(features: Tensor, centroids: Tensor,
                            chunk_size: int) -> tuple[Tensor, Tensor]:
    """Chunked (argmax, max) of cosine similarity; inputs already normalised, same device."""
    num = features.shape[0]
    rows = _rows_per_chunk(chunk_size, centroids.shape[0])
    assignments = torch.empty(num, dtype=torch.long, device=features.device)
    similarity = torch.empty(num, dtype=torch.float32, device=features.device)
    cent_t = centroids.t().contiguous()
    for start in range(0, num, rows):
        best, index = (features[start:start + rows] @ cent_t).max(dim=1)
        assignments[start:start + rows] = index
        similarity[start:start + rows] = best
    return assignments, similarity


def assign_by_cosine(features: ArrayLike, centroids: ArrayLike, chunk_size: int = 65536) -> Tensor:
    """Index ``[N]`` of the most cosine-similar centroid for every feature.

    Rows are processed in chunks of at most ``chunk_size`` (fewer when K is large, so that one
    similarity block stays under 2**26 entries); the result lives on the features' device.
    """
    if chunk_size < 1:
        raise ValueError(f'chunk_size must be >= 1, got {chunk_size}')
    feats = _to_features(features)
    cents = _to_features(centroids).to(feats.device)
    if cents.shape[1] != feats.shape[1]:
        raise ValueError(f'features have dimension {feats.shape[1]} but centroids have '
                         f'{cents.shape[1]}')
    return _assign_with_similarity(feats, cents, chunk_size)[0]


# ----------------------------------------------------------------------------- torch backend


def _nearest_l2(points: Tensor, centroids: Tensor) -> tuple[Tensor, Tensor]:
    """Chunked nearest centroid in squared L2 distance: (assignments, squared distances)."""
    num = points.shape[0]
    rows = _rows_per_chunk(65536, centroids.shape[0])
    # argmin ||x - c||^2 = argmax (x·c - ||c||^2 / 2); avoids materialising differences.
    half_sq = 0.5 * (centroids * centroids).sum(dim=1)
    cent_t = centroids.t().contiguous()
    assignments = torch.empty(num, dtype=torch.long, device=points.device)
    distances = torch.empty(num, dtype=torch.float32, device=points.device)
    for start in range(0, num, rows):
        chunk = points[start:start + rows]
        best, index = (chunk @ cent_t - half_sq).max(dim=1)
        assignments[start:start + rows] = index
        distances[start:start + rows] = ((chunk * chunk).sum(dim=1) - 2 * best).clamp_(min=0)
    return assignments, distances


def _uniform(generator: torch.Generator, device: torch.device) -> float:
    return float(torch.rand(1, generator=generator, device=device, dtype=torch.float64))


def _init_centroids(points: Tensor, k: int, init: str, generator: torch.Generator) -> Tensor:
    num, device = points.shape[0], points.device
    if init == 'random':
        # As faiss: k distinct training points drawn uniformly.
        return points[torch.randperm(num, generator=generator, device=device)[:k]].clone()
    # k-means++ (D^2 sampling); inverse-CDF draws avoid torch.multinomial's 2**24 category cap.
    centroids = torch.empty(k, points.shape[1], dtype=points.dtype, device=device)
    first = min(int(_uniform(generator, device) * num), num - 1)
    centroids[0] = points[first]
    min_d2 = ((points - centroids[0]) ** 2).sum(dim=1)
    for j in range(1, k):
        cumulative = torch.cumsum(min_d2.double(), dim=0)
        total = float(cumulative[-1])
        if total <= 0:  # every point coincides with a chosen centre: fall back to uniform
            pick = min(int(_uniform(generator, device) * num), num - 1)
        else:
            target = torch.tensor([_uniform(generator, device) * total], dtype=torch.float64,
                                  device=device)
            pick = min(int(torch.searchsorted(cumulative, target)), num - 1)
        centroids[j] = points[pick]
        min_d2 = torch.minimum(min_d2, ((points - centroids[j]) ** 2).sum(dim=1))
    return centroids


def _update_centroids(points: Tensor, assignments: Tensor, distances: Tensor,
                      centroids: Tensor) -> Tensor:
    k = centroids.shape[0]
    sums = torch.zeros_like(centroids).index_add_(0, assignments, points)
    counts = torch.bincount(assignments, minlength=k)
    new = torch.where((counts > 0).unsqueeze(1), sums / counts.clamp(min=1).unsqueeze(1).float(),
                      centroids)
    empty = torch.nonzero(counts == 0).flatten()
    if empty.numel() > 0:
        # Re-seed empty clusters on the points worst served by the current centroids: a
        # deterministic choice (no RNG) that targets the largest residuals.
        far = torch.topk(distances, int(empty.numel())).indices
        new[empty] = points[far]
    return new


def _torch_kmeans(points: Tensor, k: int, niter: int, nredo: int, max_points_per_centroid: int,
                  seed: int, init: str, verbose: bool) -> Tensor:
    """Unnormalised centroids ``[K, D]`` of the best of ``nredo`` Lloyd runs."""
    device = points.device
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))
    num = points.shape[0]
    if num > k * max_points_per_centroid:
        sample = torch.randperm(num, generator=generator, device=device)
        points = points[sample[:k * max_points_per_centroid]]
    best_centroids, best_objective = None, math.inf
    for redo in range(nredo):
        centroids = _init_centroids(points, k, init, generator)
        objective = math.inf
        for it in range(niter):
            assignments, distances = _nearest_l2(points, centroids)
            objective = float(distances.sum())
            centroids = _update_centroids(points, assignments, distances, centroids)
            if verbose:
                print(f'[torch k-means] redo {redo} iter {it}: objective {objective:.6g}',
                      flush=True)
        if best_centroids is None or objective < best_objective:
            best_centroids, best_objective = centroids, objective
    return best_centroids


# ----------------------------------------------------------------------------- faiss backend


def _import_faiss():
    try:
        import faiss
    except ImportError as err:
        raise ImportError('the faiss k-means backend needs faiss: `pip install faiss-cpu` (or '
                          'faiss-gpu for CUDA), or use backend="torch"') from err
    return faiss


def _faiss_kmeans(points: Tensor, k: int, niter: int, nredo: int, max_points_per_centroid: int,
                  min_points_per_centroid: int, seed: int, init: str, verbose: bool) -> Tensor:
    """Unnormalised centroids ``[K, D]`` from faiss.Clustering with PCL's settings."""
    faiss = _import_faiss()
    dim = points.shape[1]
    clus = faiss.Clustering(dim, k)
    clus.verbose = bool(verbose)
    clus.niter = int(niter)
    clus.nredo = int(nredo)
    clus.seed = int(seed) % (1 << 31)  # faiss stores the seed in a C int
    # Set explicitly: faiss's default of 256 points per centroid silently subsamples.
    clus.max_points_per_centroid = int(max_points_per_centroid)
    clus.min_points_per_centroid = int(min_points_per_centroid)
    clus.spherical = False  # as PCL; centroids are normalised afterwards
    if init == 'k-means++':
        if not hasattr(clus, 'init_method'):
            raise ValueError('this faiss version has no k-means++ initialisation; use '
                             'init="random" or backend="torch"')
        clus.init_method = faiss.ClusteringInitMethod_KMEANS_PLUS_PLUS
    num_gpus = getattr(faiss, 'get_num_gpus', lambda: 0)()
    if num_gpus > 0:
        resources = faiss.StandardGpuResources()
        config = faiss.GpuIndexFlatConfig()
        config.useFloat16 = False
        config.device = points.device.index if points.is_cuda and points.device.index is not None \
            else (torch.cuda.current_device() if torch.cuda.is_available() else 0)
        index = faiss.GpuIndexFlatL2(resources, dim, config)
    else:
        index = faiss.IndexFlatL2(dim)
    data = np.ascontiguousarray(points.cpu().numpy(), dtype=np.float32)
    clus.train(data, index)
    centroids = faiss.vector_to_array(clus.centroids).reshape(k, dim)
    return torch.from_numpy(centroids.copy()).to(points.device)


def _faiss_available() -> bool:
    try:
        _import_faiss()
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- public API


def _kmeans_normalised(feats: Tensor, num_clusters: int, niter: int, nredo: int,
                       max_points_per_centroid: int, min_points_per_centroid: int, seed: int,
                       backend: str, init: str, verbose: bool) -> KMeansResult:
    num = feats.shape[0]
    if int(num_clusters) != num_clusters or num_clusters < 1:
        raise ValueError(f'num_clusters must be a positive integer, got {num_clusters}')
    num_clusters = int(num_clusters)
    if num_clusters > num:
        raise ValueError(f'cannot form {num_clusters} clusters from {num} samples; use a smaller '
                         f'number of clusters or more data')
    if niter < 1 or nredo < 1:
        raise ValueError(f'niter and nredo must be >= 1, got {niter} and {nredo}')
    if max_points_per_centroid < 1 or min_points_per_centroid < 0:
        raise ValueError('max_points_per_centroid must be >= 1 and min_points_per_centroid >= 0')
    if backend not in KMEANS_BACKENDS:
        raise ValueError(f'unknown k-means backend {backend!r}; valid: {KMEANS_BACKENDS}')
    if init not in _INITS:
        raise ValueError(f'unknown k-means init {init!r}; valid: {_INITS}')
    if backend == 'auto':
        backend = 'faiss' if _faiss_available() else 'torch'
    if num < num_clusters * min_points_per_centroid:
        warnings.warn(f'k-means: {num} points for {num_clusters} clusters is fewer than '
                      f'{min_points_per_centroid} points per centroid; clusters may be unreliable',
                      stacklevel=3)
    if backend == 'faiss':
        raw = _faiss_kmeans(feats, num_clusters, niter, nredo, max_points_per_centroid,
                            min_points_per_centroid, seed, init, verbose)
    else:
        raw = _torch_kmeans(feats, num_clusters, niter, nredo, max_points_per_centroid, seed, init,
                            verbose)
    centroids = F.normalize(raw.float(), dim=1)
    assignments, similarity = _assign_with_similarity(feats, centroids, 65536)
    # Unit features and centroids: ||x - c||^2 = 2 - 2 cos(x, c); same definition for every
    # backend, so objectives are comparable.
    objective = float((2.0 - 2.0 * similarity.double()).clamp(min=0).sum())
    return KMeansResult(centroids=centroids, assignments=assignments, objective=objective,
                        backend=backend)


def kmeans(features: ArrayLike,
           num_clusters: int,
           *,
           niter: int = 20,
           nredo: int = 5,
           max_points_per_centroid: int = 1000,
           min_points_per_centroid: int = 10,
           seed: int = 0,
           backend: str = 'auto',
           init: str = 'random',
           verbose: bool = False) -> KMeansResult:
    """Cluster ``[N, D]`` features into ``num_clusters`` groups (PCL's k-means settings).

    ``backend``: ``'faiss'``, ``'torch'`` or ``'auto'`` (faiss when importable). ``init``:
    ``'random'`` (faiss's default, as PCL) or ``'k-means++'``. The returned centroids are
    L2-normalised and the assignments are by maximum cosine similarity over all N features.
    """
    feats = _to_features(features)
    return _kmeans_normalised(feats, num_clusters, niter, nredo, max_points_per_centroid,
                              min_points_per_centroid, seed, backend, init, verbose)


def multi_level_kmeans(features: ArrayLike,
                       ks: Sequence[int],
                       *,
                       seed: int = 0,
                       **kwargs) -> list[KMeansResult]:
    """Run :func:`kmeans` once per granularity in ``ks``, with a different seed per level."""
    if len(ks) == 0:
        raise ValueError('ks must name at least one number of clusters')
    feats = _to_features(features)  # normalise (and copy) once for all levels
    # kmeans()'s keyword defaults, so the two entry points cannot drift apart.
    options = {
        name: param.default
        for name, param in inspect.signature(kmeans).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY and name != 'seed'
    }
    unknown = set(kwargs) - set(options)
    if unknown:
        raise TypeError(f'unexpected k-means options: {sorted(unknown)}')
    options.update(kwargs)
    return [
        _kmeans_normalised(feats, k, options['niter'], options['nredo'],
                           options['max_points_per_centroid'], options['min_points_per_centroid'],
                           seed + level * _LEVEL_SEED_STRIDE, options['backend'], options['init'],
                           options['verbose']) for level, k in enumerate(ks)
    ]
