"""The torch k-means backend: PCL's Lloyd iterations in PyTorch on the CPU or a GPU, sharded or not.

With ``sample_index`` (the data-set index of each row) every process of the default process group
holds only its shard of the features, runs the Lloyd steps on it and all-reduces the per-centroid
sums and counts. Sampling, initialisation and restarts are drawn from the same seeded generator on
every rank over global indices, so the result equals the one-process run on all the features (see
``_Shard``). Nothing here reads a value on the host inside the iterations.
"""
from __future__ import annotations

import math

import torch
from mmengine.dist import all_gather, get_world_size, is_main_process
from torch import Tensor

from ifnd.dist import all_reduce_sum

__all__ = ['rows_per_chunk', 'torch_kmeans']

# Upper bound on the entries of one [chunk, K] similarity block (256 MiB in float32).
_BLOCK_ELEMENTS = 1 << 26


def rows_per_chunk(chunk_size: int, num_cols: int) -> int:
    """Rows of one chunk: at most ``chunk_size``, fewer when a row has many columns."""
    return max(1, min(int(chunk_size), _BLOCK_ELEMENTS // max(1, num_cols)))


def _nearest_l2(points: Tensor, centroids: Tensor) -> tuple[Tensor, Tensor]:
    """Chunked nearest centroid in squared L2 distance: (assignments, squared distances)."""
    num = points.shape[0]
    rows = rows_per_chunk(65536, centroids.shape[0])
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
    rows = rows_per_chunk(65536, points.shape[1])
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


def torch_kmeans(points: Tensor, k: int, niter: int, nredo: int, max_points_per_centroid: int,
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
