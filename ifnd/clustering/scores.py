"""The scores acceptance ranks a round's samples by: IFND's confidence κ and PCL's concentration.

κ (Eq. ``eq:certainty``) is per sample: the softmax over the centroids at the sample's own
cluster. PCL's concentration φ is per cluster; :func:`cluster_confidence` gives each sample its
cluster's ``-φ`` (tighter clusters first). ``ifnd/clustering/acceptance.py`` decides from them.
"""
from __future__ import annotations

from typing import Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ifnd.dist import all_reduce_sum

__all__ = ['confidence', 'pcl_concentration', 'cluster_confidence']


ArrayLike = Union[Tensor, np.ndarray]


def _as_tensor(x: ArrayLike) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


def confidence(z: ArrayLike,
               centroids: ArrayLike,
               assignments: ArrayLike,
               temperature: float,
               chunk_size: int = 8192) -> Tensor:
    """κ_i of Eq. eq:certainty: softmax over centroids of cos(z_i, c_j)/τ at the assigned cluster.

    Rows are processed ``chunk_size`` at a time, so memory is O(chunk_size * K). Returns a float32
    ``[N]`` tensor on ``z``'s device.
    """
    z, centroids, assignments = _as_tensor(z), _as_tensor(centroids), _as_tensor(assignments)
    if z.ndim != 2 or centroids.ndim != 2 or z.shape[1] != centroids.shape[1]:
        raise ValueError(f'z must be [N, D] and centroids [K, D], got {tuple(z.shape)} and '
                         f'{tuple(centroids.shape)}')
    if assignments.shape != (z.shape[0], ):
        raise ValueError(f'assignments must be [{z.shape[0]}], got {tuple(assignments.shape)}')
    if temperature <= 0 or chunk_size < 1:
        raise ValueError(f'temperature and chunk_size must be positive, got {temperature} and '
                         f'{chunk_size}')
    device = z.device
    cents_t = F.normalize(centroids.detach().to(device=device, dtype=torch.float32), dim=1).t()
    assignments = assignments.to(device=device, dtype=torch.long)
    out = torch.empty(z.shape[0], dtype=torch.float32, device=device)
    for start in range(0, z.shape[0], chunk_size):
        chunk = F.normalize(z[start:start + chunk_size].detach().float(), dim=1)
        log_prob = torch.log_softmax(chunk @ cents_t / temperature, dim=1)
        picked = log_prob.gather(1, assignments[start:start + chunk_size].unsqueeze(1))
        out[start:start + chunk_size] = picked.squeeze(1).exp()
    return out


def pcl_concentration(features: ArrayLike,
                      centroids: ArrayLike,
                      assignments: ArrayLike,
                      temperature: float,
                      alpha: float = 10.0,
                      sharded: bool = False) -> Tensor:
    """PCL's per-cluster concentration φ ``[K]`` (Eq. 9 of PCL, as in its official code).

    φ_k = Σ_{z∈k} ||z − c_k||₂ / (n_k log(n_k + α)); clusters with at most one point take the
    largest φ of the others; φ is clipped to its 10th/90th percentiles and rescaled to mean τ.
    ``sharded``: the features are this process's shard; the per-cluster sums are added over the
    process group (in float64, so the order of addition does not show in float32 φ).
    """
    features, centroids = _as_tensor(features), _as_tensor(centroids)
    assignments = _as_tensor(assignments)
    if features.ndim != 2 or centroids.ndim != 2 or features.shape[1] != centroids.shape[1]:
        raise ValueError(f'features must be [N, D] and centroids [K, D], got '
                         f'{tuple(features.shape)} and {tuple(centroids.shape)}')
    if assignments.shape != (features.shape[0], ):
        raise ValueError(f'assignments must be [{features.shape[0]}], got '
                         f'{tuple(assignments.shape)}')
    if temperature <= 0:
        raise ValueError(f'temperature must be positive, got {temperature}')
    device = features.device
    k = centroids.shape[0]
    centroids = centroids.detach().to(device=device, dtype=torch.float32)
    assignments = assignments.to(device=device, dtype=torch.long)
    dist_sum = torch.zeros(k, dtype=torch.float64, device=device)
    chunk = 65536  # bounds the [chunk, D] difference buffer
    for start in range(0, features.shape[0], chunk):
        idx = assignments[start:start + chunk]
        diff = features[start:start + chunk].detach().float() - centroids[idx]
        dist_sum.index_add_(0, idx, diff.norm(dim=1).double())
    counts = torch.bincount(assignments, minlength=k)
    if sharded:
        all_reduce_sum(dist_sum)
        all_reduce_sum(counts)
    counts = counts.double()
    multi = counts > 1
    phi = torch.zeros(k, dtype=torch.float64, device=device)
    phi[multi] = dist_sum[multi] / (counts[multi] * torch.log(counts[multi] + alpha))
    if not bool(multi.any()):
        # No cluster has two points: nothing to estimate, every cluster gets the mean value.
        return torch.full((k, ), float(temperature), dtype=torch.float32, device=device)
    phi[~multi] = phi[multi].max()
    # PCL clamps extreme values for stability (np.percentile's linear interpolation).
    low, high = torch.quantile(phi, torch.tensor([0.1, 0.9], dtype=torch.float64, device=device))
    phi = phi.clamp(min=float(low), max=float(high))
    mean = phi.mean()
    if float(mean) <= 0:
        return torch.full((k, ), float(temperature), dtype=torch.float32, device=device)
    return (temperature * phi / mean).float()


def cluster_confidence(concentration: ArrayLike, assignments: ArrayLike) -> Tensor:
    """PCL-style per-sample confidence ``-φ[assignment]``: tighter clusters are more confident."""
    concentration, assignments = _as_tensor(concentration), _as_tensor(assignments)
    return -concentration[assignments.to(device=concentration.device, dtype=torch.long)]
