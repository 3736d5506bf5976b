"""k-means for pseudo labels: the backends' table, the public entry points, and the faiss backend.

Every backend follows PCL's recipe: plain (non-spherical) Lloyd iterations on L2-normalised
features, several restarts keeping the best objective, training on a seeded random sample of at
most ``k * max_points_per_centroid`` points; the centroids are then L2-normalised and every
feature is assigned to the centroid of highest cosine similarity.

Levels of several k are clustered independently (:func:`multi_level_kmeans`, IFND's), or nested
as HCSC's hierarchical k-means (:func:`nested_kmeans`): each level clusters the finer level's
centroids; ``HIERARCHIES`` names both.

``BACKEND_TABLE`` names each backend with its fit function, whether it is installed, the devices
``backend='auto'`` picks it for and whether it shards over processes; the one ``'auto'`` rule
(:func:`choose_backend`) and the command lines' choices read it. faiss runs here; the torch
backend, which also runs sharded (``sample_index``), is ``torch_kmeans.py``.
"""
from __future__ import annotations

import inspect
import typing
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.dist import get_world_size, is_main_process
from torch import Tensor

from ifnd.dist import all_reduce_sum

from .torch_kmeans import rows_per_chunk, torch_kmeans

__all__ = ['KMeansResult', 'kmeans', 'multi_level_kmeans', 'nested_kmeans', 'HIERARCHIES',
           'check_hierarchy', 'assign_by_cosine', 'KMeansBackend', 'BACKEND_TABLE',
           'KMEANS_BACKENDS', 'choose_backend', 'faiss_gpu_available', 'resolve_backend',
           'sharding_backend', 'kmeans_options', 'check_kmeans_options']

_INITS = ('random', 'k-means++')
# Seed offset between levels of multi_level_kmeans (a prime, so level seeds rarely coincide
# with the per-round seeds a caller derives from the same base).
_LEVEL_SEED_STRIDE = 1009

ArrayLike = Union[Tensor, np.ndarray]


@dataclass
class KMeansResult:
    """Result of one k-means run."""

    centroids: Tensor  # [K, D] float32, L2-normalised
    # [N] int64, index of the most cosine-similar centroid (a nested upper level: the sample's
    # finer cluster's parent)
    assignments: Tensor
    objective: float  # sum_i ||x_i - c_{a_i}||^2 over the normalised points clustered and centroids
    backend: str  # backend actually used, a name of BACKEND_TABLE
    device: str = 'cpu'  # where the Lloyd iterations ran, e.g. 'cuda:0'
    num_shards: int = 1  # processes the features were sharded over (assignments: this shard's)
    # A nested upper level only: [k of the finer level] int64, each finer cluster's cluster here
    parents: Tensor | None = None

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


def _assign_with_similarity(features: Tensor, centroids: Tensor,
                            chunk_size: int) -> tuple[Tensor, Tensor]:
    """Chunked (argmax, max) of cosine similarity; inputs already normalised, same device."""
    num = features.shape[0]
    rows = rows_per_chunk(chunk_size, centroids.shape[0])
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


# ----------------------------------------------------------------------------- the table


def _fit_faiss(points: Tensor, k: int, niter: int, nredo: int, max_points_per_centroid: int,
               min_points_per_centroid: int, seed: int, init: str, verbose: bool,
               sample_index: Tensor | None, num: int) -> tuple[Tensor, str]:
    """faiss's unnormalised centroids and where it ran (it never shards: no ``sample_index``)."""
    return _faiss_kmeans(points, k, niter, nredo, max_points_per_centroid,
                         min_points_per_centroid, seed, init, verbose)


def _fit_torch(points: Tensor, k: int, niter: int, nredo: int, max_points_per_centroid: int,
               min_points_per_centroid: int, seed: int, init: str, verbose: bool,
               sample_index: Tensor | None, num: int) -> tuple[Tensor, str]:
    """PyTorch's unnormalised centroids and where they were computed (the features' device)."""
    return torch_kmeans(points, k, niter, nredo, max_points_per_centroid, seed, init, verbose,
                        sample_index, num), str(points.device)


@dataclass(frozen=True)
class KMeansBackend:
    """One k-means backend: how it fits, whether it runs here and where, whether it shards."""

    label: str  # its name in messages
    fit: Callable[..., tuple[Tensor, str]]  # the arguments of _fit_torch
    installed: Callable[[], bool]  # importable here
    gpu: Callable[[], bool]  # runs on a CUDA GPU here (a CPU-only build does not)
    devices: tuple[str, ...]  # device types 'auto' picks it for; () for every torch device
    shards: bool  # runs sharded over the processes, each on its own rows (sample_index)


# The backends by name. 'auto' takes the first that runs on the features' device and is usable
# here (installed; on CUDA, with a GPU build), so the order is the preference: faiss on the GPU
# or on the CPU, else PyTorch on the device, which on a GPU beats faiss on the CPU by an order of
# magnitude and is the only backend on other accelerators (faiss has no build for them). Sharded
# rounds take the first backend that shards. The lambdas look their checks up at each call.
BACKEND_TABLE: dict[str, KMeansBackend] = {
    'faiss': KMeansBackend('faiss', _fit_faiss, lambda: _faiss_available(),
                           lambda: faiss_gpu_available(), ('cuda', 'cpu'), shards=False),
    'torch': KMeansBackend('PyTorch', _fit_torch, lambda: True, lambda: True, (), shards=True),
}
KMEANS_BACKENDS = ('auto', *BACKEND_TABLE)


def choose_backend(device: Union[torch.device, str], installed: Mapping[str, bool] | None = None,
                   gpu: Mapping[str, bool] | None = None, shards: bool = False) -> str:
    """The backend ``'auto'`` means for features on ``device``: the first of the table usable there.

    ``installed`` and ``gpu`` say, by backend name, whether it is installed and has a GPU build
    that sees a GPU (a name left out: the table's own check, made here); ``shards``: among the
    backends that shard over processes only.
    """
    device_type = torch.device(device).type
    installed, gpu = installed or {}, gpu or {}
    for name, backend in BACKEND_TABLE.items():
        if shards and not backend.shards or backend.devices and device_type not in backend.devices:
            continue
        usable = installed[name] if name in installed else backend.installed()
        if usable and device_type == 'cuda':
            usable = gpu[name] if name in gpu else backend.gpu()
        if usable:
            return name
    raise ValueError(f'no k-means backend runs on {device_type} here; valid: {KMEANS_BACKENDS}')


def resolve_backend(backend: str, device: Union[torch.device, str], shards: bool = False) -> str:
    """``backend`` itself, or for ``'auto'`` :func:`choose_backend` with what is installed here."""
    if backend not in KMEANS_BACKENDS:
        raise ValueError(f'unknown k-means backend {backend!r}; valid: {KMEANS_BACKENDS}')
    return choose_backend(device, shards=shards) if backend == 'auto' else backend


def sharding_backend() -> str:
    """The first backend of the table that shards over processes (what sharded rounds run)."""
    return next(name for name, backend in BACKEND_TABLE.items() if backend.shards)


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
    backend = resolve_backend(backend, feats.device, shards=sample_index is not None)
    if sample_index is not None and not BACKEND_TABLE[backend].shards:
        name = sharding_backend()
        raise ValueError(f'sharded k-means (sample_index given) runs on the {name} backend; use '
                         f'backend="{name}" or "auto"')
    if num < num_clusters * min_points_per_centroid and is_main_process():
        warnings.warn(f'k-means: {num} points for {num_clusters} clusters is fewer than '
                      f'{min_points_per_centroid} points per centroid; clusters may be unreliable',
                      stacklevel=3)
    raw, where = BACKEND_TABLE[backend].fit(feats, num_clusters, niter, nredo,
                                            max_points_per_centroid, min_points_per_centroid, seed,
                                            init, verbose, sample_index, num)
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

    ``backend``: a name of ``BACKEND_TABLE`` or ``'auto'`` (see :func:`choose_backend`). ``init``:
    ``'random'`` (faiss's default, as PCL) or ``'k-means++'``. ``device``: where to cluster
    (default: the features' device); the results live there. The returned centroids are
    L2-normalised and the assignments are by maximum cosine similarity over all N features.
    ``sample_index``: the features are this process's shard of a data set split over the
    default process group, row ``i`` being sample ``sample_index[i]``; a backend that shards (the
    torch one) then clusters all shards together (same centroids as one process on all the
    features, on every rank) and returns this shard's assignments.
    """
    feats, index = _prepare(features, device, sample_index)
    return _kmeans_normalised(feats, num_clusters, niter, nredo, max_points_per_centroid,
                              min_points_per_centroid, seed, backend, init, verbose, index)


def _level_fitter(features: ArrayLike, ks: Sequence[int], seed: int,
                  kwargs: dict) -> tuple[Tensor, Tensor | None, Callable[..., KMeansResult]]:
    """The features normalised (and copied) once for all levels, their shard index, and the fit
    of one level: ``fit(points, k, level, sample_index, min_points_per_centroid=the option's)``
    with the level's seed."""
    if len(ks) == 0:
        raise ValueError('ks must name at least one number of clusters')
    options = check_kmeans_options(kwargs)
    feats, index = _prepare(features, options['device'], options['sample_index'])

    def fit(points: Tensor, k: int, level: int, sample_index: Tensor | None,
            min_points_per_centroid: int = options['min_points_per_centroid']) -> KMeansResult:
        return _kmeans_normalised(points, k, options['niter'], options['nredo'],
                                  options['max_points_per_centroid'], min_points_per_centroid,
                                  seed + level * _LEVEL_SEED_STRIDE, options['backend'],
                                  options['init'], options['verbose'], sample_index)
    return feats, index, fit


def multi_level_kmeans(features: ArrayLike,
                       ks: Sequence[int],
                       *,
                       seed: int = 0,
                       **kwargs) -> list[KMeansResult]:
    """Run :func:`kmeans` once per granularity in ``ks``, with a different seed per level."""
    feats, index, fit = _level_fitter(features, ks, seed, kwargs)
    return [fit(feats, k, level, index) for level, k in enumerate(ks)]


def nested_kmeans(features: ArrayLike,
                  ks: Sequence[int],
                  *,
                  seed: int = 0,
                  **kwargs) -> list[KMeansResult]:
    """HCSC's hierarchical k-means: :func:`kmeans` on the features at ``ks[0]``, then each level on
    the finer level's normalised centroids, ``ks`` strictly decreasing (fine to coarse).

    Level l + 1 holds ``parents`` (level l's clusters -> its own) and every sample's composed
    cluster, ``parents[assignments of level l]``. The options and seeds are those of
    :func:`multi_level_kmeans`; sharded (``sample_index``), the first level runs sharded and the
    upper ones, on the centroids every process holds alike, run whole on each process.
    """
    check_hierarchy('nested', ks)
    feats, index, fit = _level_fitter(features, ks, seed, kwargs)
    levels = [fit(feats, ks[0], 0, index)]
    for level, k in enumerate(ks[1:], start=1):
        finer = levels[-1]
        # Normalised as kmeans() would (so it gives the same level); few points per centroid by
        # design: no warning about it.
        upper = fit(_to_features(finer.centroids), k, level, None, min_points_per_centroid=0)
        upper.parents = upper.assignments
        upper.assignments = upper.parents[finer.assignments]
        upper.num_shards = finer.num_shards
        levels.append(upper)
    return levels


# How each hierarchy clusters the levels of ``ks``: independently (IFND's) or nested (HCSC's).
HIERARCHIES: dict[str, Callable[..., list[KMeansResult]]] = {
    'independent': multi_level_kmeans,
    'nested': nested_kmeans,
}


def check_hierarchy(hierarchy: object, ks: Sequence[int], owner: str = 'k-means') -> None:
    """Refuse an unknown hierarchy, and nested levels that are not strictly fine to coarse."""
    if hierarchy not in HIERARCHIES:
        raise ValueError(f'{owner} hierarchy must be one of {", ".join(map(repr, HIERARCHIES))}, '
                         f'got {hierarchy!r}')
    if hierarchy == 'nested' and any(finer <= coarser for finer, coarser in zip(ks, ks[1:])):
        raise ValueError(f"{owner} hierarchy='nested' clusters each level's centroids into the "
                         f'next level, so num_clusters must decrease strictly (fine to coarse), '
                         f'got {list(ks)}: write it e.g. as [100, 30, 10]')


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
