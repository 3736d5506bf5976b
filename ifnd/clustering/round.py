"""One clustering round of IFND: features in; pseudo labels, confidences and statistics out.

A round is multi-level k-means, then per level the score of every sample (κ, Eq.
``eq:certainty``, or PCL's per-cluster concentration) and the round's acceptance of labels by it
(``acceptance.py``: the ``ceil(rate * N)`` highest scores, or the round's evidence). It needs no Runner: PseudoLabelHook runs it on the training set's
features, benchmarks/clustering_cost.py on random ones, and both get the same labels.

The levels are clustered independently (IFND's) or nested (``hierarchy='nested'``, HCSC's:
each level clusters the finer level's centroids, and a sample's cluster at a coarser level is its
finer cluster's parent). Nested levels are scored as independent ones, from the samples: κ of a
sample at level l is the softmax over level l's centroids at its composed cluster, and φ of a
level-l cluster PCL's estimate from the samples composed into it (many points, where HCSC's code
estimates an upper level's φ from its few child centroids).

Sharded (``num_samples`` given), every process holds the rows ``shard_index(num_samples)`` of the
features: k-means all-reduces its per-centroid sums, the confidence is computed per shard and only
the per-sample assignments and confidences are gathered, so every process ends with the labels of
one process on all the features (nested, the upper levels cluster the centroids every process
holds alike, whole on each). :func:`broadcast_round` then hands rank 0's labels, centroids,
concentrations and parent maps (padded to the largest k) to every process.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch
from mmengine.dist import broadcast, is_main_process
from torch import Tensor

from ifnd.dist import gather_shards, shard_index

from .acceptance import Acceptance
from .kmeans import (BACKEND_TABLE, HIERARCHIES, check_hierarchy, check_kmeans_options,
                     kmeans_options, resolve_backend, sharding_backend)
from .scores import cluster_confidence, confidence, pcl_concentration

__all__ = ['SCORES', 'ROUND_SET_KMEANS_OPTIONS', 'ClusteringRound', 'round_kmeans_options',
           'check_round_options', 'plan_round', 'round_seed', 'clustering_round', 'pad_levels',
           'pad_parents', 'broadcast_round']

# What acceptance ranks by. 'kappa': IFND's per-sample κ; 'pcl': PCL's per-cluster concentration,
# tighter clusters first.
SCORES = ('kappa', 'pcl')
# kmeans() options a round sets itself: the seed (per round and level), the features' device and,
# when sharded, each process's rows.
ROUND_SET_KMEANS_OPTIONS = ('seed', 'device', 'sample_index')
# Seed offset between rounds (a prime, as the per-level offset inside multi_level_kmeans).
_ROUND_SEED_STRIDE = 7919


@dataclass
class ClusteringRound:
    """What one round produced; per-sample tensors cover all N samples, on the CPU."""

    labels: Tensor  # [levels, N] int64: the accepted cluster ids, -(i + 1) for the others
    assignments: list[Tensor]  # per level [N] int64: every sample's cluster
    scores: list[Tensor]  # per level [N] float32: the score acceptance ranked by
    centroids: list[Tensor]  # per level [k, D] float32, L2-normalised, on the features' device
    concentrations: list[Tensor]  # per level [k]: PCL's φ where computed, else ones
    # per level [k] int64: each cluster's cluster at the next, coarser level (nested levels but the
    # last); None where the level has no parent level
    parents: list[Tensor | None]
    stats: dict  # timings, where k-means ran, and per level sizes and acceptance (JSON-ready)


def round_kmeans_options() -> dict[str, type]:
    """The k-means options a round takes from its caller, with their types (plus ``sharded``)."""
    return {**{name: param.annotation for name, param in kmeans_options().items()
               if name not in ROUND_SET_KMEANS_OPTIONS},
            'sharded': bool | None}


def check_round_options(score: str, kmeans: dict | None,
                        owner: str = 'the clustering round') -> tuple[dict, bool | None]:
    """Check a round's settings once, before any round: ``(k-means options, sharded)``.

    ``kmeans``: the options of :func:`round_kmeans_options`; the k-means ones come back complete
    (defaults filled in), ``sharded`` apart: None (sharded where several processes run the torch
    backend), True or False. ``owner`` names the caller in the error messages.
    """
    _check_score(score)
    options = dict(kmeans or {})
    sharded = options.pop('sharded', None)
    if sharded not in (None, True, False):
        raise ValueError(f'kmeans.sharded must be None (auto), True or False, got {sharded!r}')
    backend = options.get('backend', 'auto')
    if sharded and backend in BACKEND_TABLE and not BACKEND_TABLE[backend].shards:
        name = sharding_backend()
        raise ValueError(f'kmeans.sharded=True runs {BACKEND_TABLE[name].label} k-means; use '
                         f'backend="{name}" or "auto", or sharded=False for {backend}')
    for key in ROUND_SET_KMEANS_OPTIONS:
        if key in options:
            raise ValueError(f'kmeans.{key} is set by {owner} (the round\'s seed, the features\' '
                             'device and each process\'s shard); remove it from the config')
    unknown = sorted(set(options) - set(round_kmeans_options()))
    if unknown:
        raise TypeError(f'{owner} got unknown kmeans options {unknown}; it takes '
                        f'{", ".join(sorted(round_kmeans_options()))}')
    options = check_kmeans_options(options)
    return {name: value for name, value in options.items()
            if name not in ROUND_SET_KMEANS_OPTIONS}, sharded


def _check_score(kind: str) -> None:
    if kind not in SCORES:
        raise ValueError(f'score must be one of {SCORES}, got {kind!r}')


def plan_round(backend: str, sharded: bool | None, device: torch.device | str,
               world_size: int) -> tuple[str, bool]:
    """The round's k-means backend and whether it runs sharded over the processes.

    ``sharded=None`` shards where several processes would run a backend that shards (the torch
    one); a sharded round runs such a backend (see ``BACKEND_TABLE``).
    """
    backend = resolve_backend(backend, device)
    if sharded is None:
        sharded = world_size > 1 and BACKEND_TABLE[backend].shards
    if sharded and not BACKEND_TABLE[backend].shards:
        backend = resolve_backend('auto', device, shards=True)
    return backend, sharded


def round_seed(seed: int, round_number: int) -> int:
    """The k-means seed of a round: a new one every round (varied per level inside k-means)."""
    return seed + _ROUND_SEED_STRIDE * round_number


def clustering_round(features: Tensor, num_clusters: Sequence[int], *, acceptance: Acceptance,
                     temperature: float, seed: int, kmeans: dict | None = None,
                     score: str = 'kappa', concentration_temperature: float | None = None,
                     num_samples: int | None = None,
                     hierarchy: str = 'independent') -> ClusteringRound:
    """Cluster ``features`` at every level of ``num_clusters`` and accept labels by their scores.

    ``acceptance``: the scheme (``acceptance.py``), its epoch already set; it sees the round's
    assignments at the end (:meth:`Acceptance.end_round`). ``temperature``: τ of κ; ``seed``: the
    round's k-means seed (see :func:`round_seed`); ``kmeans``: options of
    :func:`ifnd.clustering.kmeans` (checked by :func:`check_round_options`); ``score``: one of
    ``SCORES``; ``concentration_temperature``: also compute PCL's concentration φ, rescaled to
    this mean τ (always computed for ``score='pcl'``, which ranks by it); ``num_samples``: the
    features are this process's shard of that many samples (see the module's notes);
    ``hierarchy``: a name of ``HIERARCHIES``: ``'independent'`` (IFND's) or ``'nested'`` (HCSC's;
    κ and φ of a level from the samples composed into its clusters, see the module's notes).
    """
    _check_score(score)
    check_hierarchy(hierarchy, num_clusters, 'the clustering round')
    sharded = num_samples is not None
    num = num_samples if sharded else features.shape[0]
    index = shard_index(num).to(features.device) if sharded else None
    tic = time.perf_counter()
    results = HIERARCHIES[hierarchy](features, num_clusters, seed=seed, **(kmeans or {}),
                                     sample_index=index)
    kmeans_s = time.perf_counter() - tic

    def gather(x: Tensor) -> Tensor:
        # Only the small per-sample arrays travel: acceptance ranks all N samples together.
        return (gather_shards(x, num) if sharded else x).cpu()

    phi_temperature = concentration_temperature
    if phi_temperature is None and score == 'pcl':
        phi_temperature = temperature  # φ's scale does not change the ranking
    labels, assignments, scores, concentrations, levels = [], [], [], [], []
    confidence_s = 0.0
    for k, res in zip(num_clusters, results):
        tic = time.perf_counter()
        phi = torch.ones(k) if phi_temperature is None else pcl_concentration(
            features, res.centroids, res.assignments, phi_temperature, sharded=sharded)
        if score == 'kappa':
            ranked = confidence(features, res.centroids, res.assignments, temperature)
        else:
            ranked = cluster_confidence(phi, res.assignments)
        assigned, ranked = gather(res.assignments), gather(ranked)
        accepted, smallest = acceptance.accept(len(labels), assigned, ranked, k)
        confidence_s += time.perf_counter() - tic
        labels.append(accepted)
        assignments.append(assigned)
        scores.append(ranked)
        concentrations.append(phi)
        levels.append(_level_stats(k, assigned, accepted, smallest))
    acceptance.end_round(assignments)
    first = results[0]
    stats = {'hierarchy': hierarchy, 'seconds_kmeans': kmeans_s, 'kmeans_backend': first.backend,
             'kmeans_device': first.device, 'kmeans_processes': first.num_shards,
             'levels': levels, 'seconds_confidence': confidence_s}
    return ClusteringRound(labels=torch.stack(labels), assignments=assignments, scores=scores,
                           centroids=[r.centroids for r in results], concentrations=concentrations,
                           parents=[r.parents for r in results[1:]] + [None], stats=stats)


def pad_levels(centroids: Sequence[Tensor], concentrations: Sequence[Tensor],
               device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Per-level centroids ``[levels, k_max, D]`` and concentrations ``[levels, k_max]`` as one
    tensor each, padded to the largest k with zero centroids and unit concentrations."""
    ks = [len(c) for c in centroids]
    device = centroids[0].device if device is None else device
    padded = torch.zeros(len(ks), max(ks), centroids[0].shape[1], device=device)
    concentration = torch.ones(len(ks), max(ks), device=device)
    for level, (c, phi) in enumerate(zip(centroids, concentrations)):
        padded[level, :len(c)] = c.to(device)
        concentration[level, :len(c)] = phi.to(device)
    return padded, concentration


def pad_parents(parents: Sequence[Tensor | None], num_clusters: Sequence[int],
                device: torch.device | str) -> Tensor:
    """Per-level parent maps ``[levels, k_max]`` int64 as one tensor, padded to the largest k with
    -1, which is also every entry of a level without parents (None)."""
    padded = torch.full((len(num_clusters), max(num_clusters)), -1, dtype=torch.long,
                        device=device)
    for level, parent in enumerate(parents):
        if parent is not None:
            padded[level, :len(parent)] = parent.to(device)
    return padded


def broadcast_round(result: ClusteringRound | None, num_clusters: Sequence[int], num_samples: int,
                    dim: int, device: torch.device | str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rank 0's labels ``[levels, N]``, padded centroids, concentrations and parent maps, on every
    process.

    ``result``: the round on rank 0 (other ranks may pass None); ``dim``: the features' width.
    The centroids and concentrations are those of :func:`pad_levels`, the parent maps those of
    :func:`pad_parents`, on ``device``.
    """
    levels, width = len(num_clusters), max(num_clusters)
    labels = torch.empty(levels, num_samples, dtype=torch.long, device=device)
    if is_main_process():
        labels.copy_(result.labels.to(device))
        centroids, concentration = pad_levels(result.centroids, result.concentrations, device)
        parents = pad_parents(result.parents, num_clusters, device)
    else:  # filled by the broadcast
        centroids = torch.empty(levels, width, dim, device=device)
        concentration = torch.empty(levels, width, device=device)
        parents = torch.empty(levels, width, dtype=torch.long, device=device)
    for tensor in (labels, centroids, concentration, parents):
        broadcast(tensor, 0)
    return labels, centroids, concentration, parents


def _level_stats(k: int, assignments: Tensor, accepted: Tensor, smallest: float) -> dict:
    """Cluster sizes and acceptance of one level (``smallest``: the smallest accepted score)."""
    sizes = torch.bincount(assignments, minlength=k).float()
    kept = accepted[accepted >= 0]
    return {'k': k, 'accept_rate': float((accepted >= 0).float().mean()),
            'smallest_accepted': smallest, 'clusters_used': int(kept.unique().numel()),
            'size_min': float(sizes.min()), 'size_median': float(sizes.median()),
            'size_max': float(sizes.max())}
