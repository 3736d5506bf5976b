"""k-means for pseudo labels: faiss (GPU if available, else CPU) or pure torch (CPU or CUDA).

Both backends follow PCL's recipe: plain (non-spherical) Lloyd iterations on L2-normalised
features, several restarts keeping the best objective, training on a seeded random sample of at
most ``k * max_points_per_centroid`` points; the centroids are then L2-normalised and every
feature is assigned to the centroid of highest cosine similarity.

The torch backend also runs sharded: with ``sample_index`` (the data-set index of each row) every
process of the default process group holds only its shard of the features, runs the Lloyd steps
on it and all-reduces the per-centroid sums and counts. Sampling, initialisation and restarts are
drawn from the same seeded generator on every rank over global indices, so the result equals the
one-process run on all the features (see ``_Shard``).
"""
from __future__ import annotations

import inspect
import math
import typing
import warnings
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.dist import all_gather, get_world_size, is_main_process
from torch import Tensor

from ifnd.dist import all_reduce_sum

__all__ = ['KMeansResult', 'kmeans', 'multi_level_kmeans', 'assign_by_cosine', 'KMEANS_BACKENDS',
           'choose_backend', 'faiss_gpu_available', 'resolve_backend', 'kmeans_options',
           'check_kmeans_options']

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
    device: str = 'cpu'  # where the Lloyd iterations ran, e.g. 'cuda:0'
    num_shards: int = 1  # processes the features were sharded over (assignments: this shard's)

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


class _Shard:
    """This process's part of the k-means training points, which are ordered by global position.

    Without sharding it is all of them (positions ``0..n-1``) and every collective is skipped.
    Sharded, a rank holds the training points whose positions are in ``positions`` (ascending),
    and every value that steers the algorithm is made identical to the one-process run:
    training points are fetched by position through a float64 all-reduce of zero-padded rows
    (exact: each row has one non-zero contribution), per-centroid sums and objectives are
    accumulated and all-reduced in float64 (sum order then changes at most the last float64 bits,
    which the cast back to float32 rounds away), counts in int64, and ties among the farthest
    points go to the lower position in both cases.
    """

    def __init__(self, points: Tensor, positions: Tensor | None, num: int) -> None:
        self.points = points
        self.num = num  # training points over all ranks
        self.distributed = positions is not None and get_world_size() > 1
        self.positions = positions if positions is not None else \
            torch.arange(num, device=points.device)

    def sum_(self, tensor: Tensor) -> Tensor:
        """In-place sum over the process group (identity in one process)."""
        return all_reduce_sum(tensor) if self.distributed else tensor

    def rows(self, positions: Tensor) -> Tensor:
        """Training points at global ``positions``, on every rank."""
        if not self.distributed:
            return self.points[positions]  # positions are row numbers here
        if len(self.positions):
            local = torch.searchsorted(self.positions, positions).clamp(max=len(self.positions) - 1)
            owned = self.positions[local] == positions
            # torch.where, not a boolean-mask write: no host read of how many rows are owned.
            out = torch.where(owned.unsqueeze(1), self.points[local].double(), 0.0)
        else:
            out = torch.zeros(len(positions), self.points.shape[1], dtype=torch.float64,
                              device=self.points.device)
        return self.sum_(out).to(self.points.dtype)

    def spread(self, values: Tensor) -> Tensor:
        """Per-point ``values`` of all ranks as one float64 vector in position order."""
        if not self.distributed:
            return values.double()
        out = torch.zeros(self.num, dtype=torch.float64, device=values.device)
        out[self.positions] = values.double()
        return self.sum_(out)

    def farthest_rows(self, distances: Tensor, count: int) -> Tensor:
        """The training points of the ``count`` largest distances, largest first; ties go to the
        lower position."""
        order = _largest(distances, self.positions, min(count, len(distances)))
        if not self.distributed:
            return self.points[order]
        # Each rank's candidates as (distance, position, point) rows in float64 (exact for all
        # three), gathered in one collective: the winners' points come with them.
        candidates = torch.cat([distances[order, None].double(),
                                self.positions[order, None].double(), self.points[order].double()],
                               dim=1)
        pad = candidates.new_zeros(count - len(order), candidates.shape[1])  # a rank with fewer
        pad[:, 0], pad[:, 1] = -math.inf, self.num
        candidates = torch.cat(all_gather(torch.cat([candidates, pad])))
        best = _largest(candidates[:, 0].float(), candidates[:, 1].long(), count)
        return candidates[best, 2:].to(self.points.dtype)


def _largest(values: Tensor, positions: Tensor, count: int) -> Tensor:
    """Indices of the ``count`` largest float32 ``values`` (descending), ties to the lower position.

    The order of a stable descending sort over points in position order, from ``topk`` on one
    int64 key per point: the value's bits above the inverted position (for values >= 0 the
    float32 bit patterns order as the values; negative ones, the padding, order below them).
    """
    bits = values.float().contiguous().view(torch.int32).long()
    key = (bits << 32) | (0xFFFFFFFF - positions)
    return torch.topk(key, count).indices


def _uniform(generator: torch.Generator, device: torch.device) -> Tensor:
    """One float64 draw in [0, 1), kept on the device."""
    return torch.rand(1, generator=generator, device=device, dtype=torch.float64)


def _init_centroids(shard: _Shard, k: int, init: str, generator: torch.Generator) -> Tensor:
    points, num, device = shard.points, shard.num, shard.points.device
    if init == 'random':
        # As faiss: k distinct training points drawn uniformly.
        return shard.rows(torch.randperm(num, generator=generator, device=device)[:k]).clone()
    # k-means++ (D^2 sampling); inverse-CDF draws avoid torch.multinomial's 2**24 category cap.
    # Sharded, the per-point distances of all ranks are spread into one vector each step, so the
    # cumulative sums (and hence the picks) are those of the one-process run.
    # Picks stay on the device (one uniform draw each, selected with torch.where): no host sync.
    centroids = torch.empty(k, points.shape[1], dtype=points.dtype, device=device)
    first = (_uniform(generator, device) * num).long().clamp_(max=num - 1)
    centroids[0] = shard.rows(first)[0]
    min_d2 = ((points - centroids[0]) ** 2).sum(dim=1)
    for j in range(1, k):
        cumulative = torch.cumsum(shard.spread(min_d2), dim=0)
        total = cumulative[-1:]
        u = _uniform(generator, device)
        # A total of 0 (every point coincides with a chosen centre) falls back to uniform.
        pick = torch.where(total > 0, torch.searchsorted(cumulative, u * total), (u * num).long())
        centroids[j] = shard.rows(pick.clamp_(max=num - 1))[0]
        min_d2 = torch.minimum(min_d2, ((points - centroids[j]) ** 2).sum(dim=1))
    return centroids


def _update_centroids(shard: _Shard, assignments: Tensor, distances: Tensor,
                      centroids: Tensor) -> Tensor:
    points = shard.points
    k = centroids.shape[0]
    # float64 sums: all-reduced shard sums then equal the one-process sums after rounding to
    # float32 (and CUDA's atomic index_add_ order stops mattering too).
    sums = torch.zeros(k, points.shape[1], dtype=torch.float64, device=points.device)
    rows = _rows_per_chunk(65536, points.shape[1])
    for start in range(0, points.shape[0], rows):
        sums.index_add_(0, assignments[start:start + rows], points[start:start + rows].double())
    # index_add_, not bincount: bincount reads the largest label on the host (CUDA).
    counts = torch.zeros(k, dtype=torch.long, device=points.device)
    counts = shard.sum_(counts.index_add_(0, assignments, torch.ones_like(assignments)))
    shard.sum_(sums)
    filled = (counts > 0).unsqueeze(1)
    new = torch.where(filled, (sums / counts.clamp(min=1).unsqueeze(1)).to(centroids.dtype),
                      centroids)
    # Re-seed empty clusters on the points worst served by the current centroids: a
    # deterministic choice (no RNG) that targets the largest residuals, the j-th empty cluster
    # on the j-th farthest point. The k farthest are fetched whether or not a cluster is empty,
    # so no shape depends on the data and nothing is read on the host.
    farthest = shard.farthest_rows(distances, k)
    empty_rank = (torch.cumsum(counts == 0, dim=0) - 1).clamp_(min=0)
    return torch.where(filled, new, farthest[empty_rank])


def _torch_kmeans(points: Tensor, k: int, niter: int, nredo: int, max_points_per_centroid: int,
                  seed: int, init: str, verbose: bool, sample_index: Tensor | None = None,
                  num: int | None = None) -> Tensor:
    """Unnormalised centroids ``[K, D]`` of the best of ``nredo`` Lloyd runs.

    ``sample_index``/``num``: global index of each row and the global row count when the rows
    are this rank's shard; every rank then returns the same centroids.
    """
    device = points.device
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))
    num = points.shape[0] if num is None else num
    positions = sample_index
    if num > k * max_points_per_centroid:
        # The same draw over global indices on every rank: position = rank in the sample.
        sample = torch.randperm(num, generator=generator,
                                device=device)[:k * max_points_per_centroid]
        if sample_index is None:
            points = points[sample]
        else:
            position_of = torch.full((num, ), -1, dtype=torch.long, device=device)
            position_of[sample] = torch.arange(len(sample), device=device)
            positions = position_of[sample_index]
            keep = positions >= 0
            points, positions = points[keep], positions[keep]
        num = len(sample)
    if positions is not None:
        positions, order = torch.sort(positions)
        points = points[order]
    shard = _Shard(points, positions, num)
    # The Lloyd steps and the choice of the best restart stay on the device: the objective is
    # only read on the host when printed (verbose).
    best_centroids = best_objective = None
    for redo in range(nredo):
        centroids = _init_centroids(shard, k, init, generator)
        for it in range(niter):
            assignments, distances = _nearest_l2(points, centroids)
            objective = shard.sum_(distances.double().sum())
            centroids = _update_centroids(shard, assignments, distances, centroids)
            if verbose and is_main_process():
                print(f'[torch k-means] redo {redo} iter {it}: objective {float(objective):.6g}',
                      flush=True)
        if best_centroids is None:
            best_centroids, best_objective = centroids, objective
        else:
            better = objective < best_objective  # strict: the first of equal restarts is kept
            best_centroids = torch.where(better, centroids, best_centroids)
            best_objective = torch.where(better, objective, best_objective)
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
                  min_points_per_centroid: int, seed: int, init: str,
                  verbose: bool) -> tuple[Tensor, str]:
    """Unnormalised centroids ``[K, D]`` from faiss.Clustering with PCL's settings, and where
    faiss ran."""
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
        where = f'cuda:{config.device}'
    else:
        index = faiss.IndexFlatL2(dim)
        where = 'cpu'
    data = np.ascontiguousarray(points.cpu().numpy(), dtype=np.float32)
    clus.train(data, index)
    centroids = faiss.vector_to_array(clus.centroids).reshape(k, dim)
    return torch.from_numpy(centroids.copy()).to(points.device), where


def _faiss_available() -> bool:
    try:
        _import_faiss()
    except ImportError:
        return False
    return True


def faiss_gpu_available() -> bool:
    """Whether faiss is installed with GPU support and sees at least one GPU."""
    if not _faiss_available():
        return False
    return getattr(_import_faiss(), 'get_num_gpus', lambda: 0)() > 0


def choose_backend(device: Union[torch.device, str], faiss_gpu: bool,
                   faiss_installed: bool = True) -> str:
    """The k-means backend that ``backend='auto'`` means for features on ``device``.

    faiss on the GPU when it has GPU support and the device is a CUDA GPU; else PyTorch k-means
    on the device when that is a GPU (an order of magnitude faster than faiss on the CPU); else
    faiss on the CPU, or PyTorch on the CPU when faiss is not installed.
    """
    device_type = torch.device(device).type
    if device_type == 'cuda' and faiss_gpu and faiss_installed:
        return 'faiss'
    if device_type != 'cpu':
        return 'torch'
    return 'faiss' if faiss_installed else 'torch'


def resolve_backend(backend: str, device: Union[torch.device, str]) -> str:
    """``backend`` itself, or for ``'auto'`` :func:`choose_backend` with faiss as installed here."""
    if backend not in KMEANS_BACKENDS:
        raise ValueError(f'unknown k-means backend {backend!r}; valid: {KMEANS_BACKENDS}')
    if backend != 'auto':
        return backend
    return choose_backend(device, faiss_gpu_available(), _faiss_available())


# ----------------------------------------------------------------------------- public API


def _check_values(niter: int, nredo: int, max_points_per_centroid: int,
                  min_points_per_centroid: int, backend: str, init: str) -> None:
    if niter < 1 or nredo < 1:
        raise ValueError(f'niter and nredo must be >= 1, got {niter} and {nredo}')
    if max_points_per_centroid < 1 or min_points_per_centroid < 0:
        raise ValueError('max_points_per_centroid must be >= 1 and min_points_per_centroid >= 0')
    if backend not in KMEANS_BACKENDS:
        raise ValueError(f'unknown k-means backend {backend!r}; valid: {KMEANS_BACKENDS}')
    if init not in _INITS:
        raise ValueError(f'unknown k-means init {init!r}; valid: {_INITS}')


def _kmeans_normalised(feats: Tensor, num_clusters: int, niter: int, nredo: int,
                       max_points_per_centroid: int, min_points_per_centroid: int, seed: int,
                       backend: str, init: str, verbose: bool,
                       sample_index: Tensor | None = None) -> KMeansResult:
    sharded = sample_index is not None and get_world_size() > 1
    num = feats.shape[0]
    if sharded:
        num = int(all_reduce_sum(torch.tensor(num, device=feats.device)))
    if int(num_clusters) != num_clusters or num_clusters < 1:
        raise ValueError(f'num_clusters must be a positive integer, got {num_clusters}')
    num_clusters = int(num_clusters)
    if num_clusters > num:
        raise ValueError(f'cannot form {num_clusters} clusters from {num} samples; use a smaller '
                         f'number of clusters or more data')
    _check_values(niter, nredo, max_points_per_centroid, min_points_per_centroid, backend, init)
    if backend == 'auto':
        backend = 'torch' if sample_index is not None else resolve_backend(backend, feats.device)
    if sample_index is not None and backend != 'torch':
        raise ValueError('sharded k-means (sample_index given) runs on the torch backend; use '
                         'backend="torch" or "auto"')
    if num < num_clusters * min_points_per_centroid and is_main_process():
        warnings.warn(f'k-means: {num} points for {num_clusters} clusters is fewer than '
                      f'{min_points_per_centroid} points per centroid; clusters may be unreliable',
                      stacklevel=3)
    where = str(feats.device)
    if backend == 'faiss':
        raw, where = _faiss_kmeans(feats, num_clusters, niter, nredo, max_points_per_centroid,
                                   min_points_per_centroid, seed, init, verbose)
    else:
        raw = _torch_kmeans(feats, num_clusters, niter, nredo, max_points_per_centroid, seed, init,
                            verbose, sample_index, num)
    centroids = F.normalize(raw.float(), dim=1)
    assignments, similarity = _assign_with_similarity(feats, centroids, 65536)
    # Unit features and centroids: ||x - c||^2 = 2 - 2 cos(x, c); same definition for every
    # backend, so objectives are comparable.
    objective = (2.0 - 2.0 * similarity.double()).clamp(min=0).sum()
    if sharded:
        objective = all_reduce_sum(objective)
    return KMeansResult(centroids=centroids, assignments=assignments, objective=float(objective),
                        backend=backend, device=where,
                        num_shards=get_world_size() if sharded else 1)


def _prepare(features: ArrayLike, device: Union[torch.device, str, None],
             sample_index: ArrayLike | None) -> tuple[Tensor, Tensor | None]:
    feats = _to_features(features)
    if device is not None:
        feats = feats.to(device)
    if sample_index is None:
        return feats, None
    index = torch.as_tensor(sample_index, dtype=torch.long).to(feats.device)
    if index.shape != (feats.shape[0], ):
        raise ValueError(f'sample_index must be [{feats.shape[0]}] (one data-set index per '
                         f'feature row), got {tuple(index.shape)}')
    num = all_reduce_sum(torch.tensor(len(index), device=feats.device))
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= int(num)):
        raise ValueError(f'sample_index must hold indices in [0, {int(num)}) that split the data '
                         f'set across the processes, got values from {int(index.min())} to '
                         f'{int(index.max())}')
    return feats, index


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
           verbose: bool = False,
           device: Union[torch.device, str, None] = None,
           sample_index: ArrayLike | None = None) -> KMeansResult:
    """Cluster ``[N, D]`` features into ``num_clusters`` groups (PCL's k-means settings).

    ``backend``: ``'faiss'``, ``'torch'`` or ``'auto'`` (see :func:`choose_backend`). ``init``:
    ``'random'`` (faiss's default, as PCL) or ``'k-means++'``. ``device``: where to cluster
    (default: the features' device); the results live there. The returned centroids are
    L2-normalised and the assignments are by maximum cosine similarity over all N features.
    ``sample_index``: the features are this process's shard of a data set split over the
    default process group, row ``i`` being sample ``sample_index[i]``; the torch backend then
    clusters all shards together (same centroids as one process on all the features, on every
    rank) and returns this shard's assignments.
    """
    feats, index = _prepare(features, device, sample_index)
    return _kmeans_normalised(feats, num_clusters, niter, nredo, max_points_per_centroid,
                              min_points_per_centroid, seed, backend, init, verbose, index)


def multi_level_kmeans(features: ArrayLike,
                       ks: Sequence[int],
                       *,
                       seed: int = 0,
                       **kwargs) -> list[KMeansResult]:
    """Run :func:`kmeans` once per granularity in ``ks``, with a different seed per level."""
    if len(ks) == 0:
        raise ValueError('ks must name at least one number of clusters')
    options = check_kmeans_options(kwargs)
    # normalise (and copy) once for all levels
    feats, index = _prepare(features, options['device'], options['sample_index'])
    return [
        _kmeans_normalised(feats, k, options['niter'], options['nredo'],
                           options['max_points_per_centroid'], options['min_points_per_centroid'],
                           seed + level * _LEVEL_SEED_STRIDE, options['backend'], options['init'],
                           options['verbose'], index) for level, k in enumerate(ks)
    ]


def kmeans_options() -> dict[str, inspect.Parameter]:
    """The keyword options of :func:`kmeans` by name, with their defaults and resolved types."""
    hints = typing.get_type_hints(kmeans)
    return {name: param.replace(annotation=hints.get(name, param.annotation))
            for name, param in inspect.signature(kmeans).parameters.items()
            if param.kind is inspect.Parameter.KEYWORD_ONLY}


def check_kmeans_options(options: dict) -> dict:
    """All keyword options of :func:`kmeans`, ``options`` over its defaults, after checking them.

    Unknown names raise TypeError, bad values ValueError: a caller can check its options once,
    before it clusters anything.
    """
    # kmeans()'s keyword defaults, so the entry points cannot drift apart.
    full = {name: param.default for name, param in kmeans_options().items()}
    unknown = set(options) - set(full)
    if unknown:
        raise TypeError(f'unexpected k-means options: {sorted(unknown)}')
    full.update(options)
    _check_values(full['niter'], full['nredo'], full['max_points_per_centroid'],
                  full['min_points_per_centroid'], full['backend'], full['init'])
    return full
