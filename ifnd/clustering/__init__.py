"""Clustering for false negative detection, below the models: it imports no model code.

- ``kmeans.py``: the k-means backends' table (``BACKEND_TABLE``: fit function, installed check,
  devices, sharding), the one ``'auto'`` rule, the faiss backend and the public entry points.
- ``torch_kmeans.py``: the torch backend, PCL's Lloyd iterations in PyTorch, sharded or not.
- ``pseudo_labels.py``: the confidence κ, PCL's concentration and the acceptance of the most
  confident labels.
- ``acceptance.py``: acceptance by the calendar (the rate of a scheme at an epoch) or by the
  evidence of a round (confidence above a threshold, clusters stable across rounds).
- ``round.py``: one clustering round joining them, and the broadcast of its labels, centroids and
  concentrations (padded to the largest k) from rank 0.
"""
from .acceptance import (ACCEPTANCE_SCHEMES, CALENDAR_SCHEMES, EVIDENCE_SCHEMES, accept_confident,
                         accept_stable, acceptance_rate, idle_schedule, match_clusters)
from .kmeans import (BACKEND_TABLE, KMEANS_BACKENDS, KMeansBackend, KMeansResult,
                     assign_by_cosine, check_kmeans_options, choose_backend, faiss_gpu_available,
                     kmeans, kmeans_options, multi_level_kmeans, resolve_backend, sharding_backend)
from .pseudo_labels import accept_labels, cluster_confidence, confidence, pcl_concentration
from .round import (CONFIDENCES, accept_level, ROUND_SET_KMEANS_OPTIONS, ClusteringRound, broadcast_round,
                    check_round_options, clustering_round, pad_levels, plan_round,
                    round_kmeans_options, round_seed)

__all__ = [
    'ACCEPTANCE_SCHEMES', 'CALENDAR_SCHEMES', 'EVIDENCE_SCHEMES', 'accept_confident', 'accept_stable',
    'acceptance_rate', 'idle_schedule', 'match_clusters',
    'BACKEND_TABLE', 'KMEANS_BACKENDS', 'KMeansBackend', 'KMeansResult', 'assign_by_cosine',
    'check_kmeans_options', 'choose_backend', 'faiss_gpu_available', 'kmeans', 'kmeans_options',
    'multi_level_kmeans', 'resolve_backend', 'sharding_backend',
    'accept_labels', 'cluster_confidence', 'confidence', 'pcl_concentration',
    'CONFIDENCES', 'accept_level', 'ROUND_SET_KMEANS_OPTIONS', 'ClusteringRound', 'broadcast_round',
    'check_round_options', 'clustering_round', 'pad_levels', 'plan_round', 'round_kmeans_options',
    'round_seed',
]
