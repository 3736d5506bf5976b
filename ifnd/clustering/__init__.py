"""Clustering for false negative detection, below the models: it imports no model code.

- ``kmeans.py``: the k-means backends' table (``BACKEND_TABLE``: fit function, installed check,
  devices, sharding), the one ``'auto'`` rule, the faiss backend and the public entry points,
  levels clustered independently or nested (``HIERARCHIES``).
- ``torch_kmeans.py``: the torch backend, PCL's Lloyd iterations in PyTorch, sharded or not.
- ``scores.py``: what acceptance ranks a round's samples by: κ and PCL's concentration.
- ``acceptance.py``: the acceptance schemes, one registered part (``ACCEPTANCES``): by the
  calendar (the ⌈r·N⌉ highest scores) or by the evidence of a round (κ far enough from chance,
  clusters stable across rounds); used by PseudoLabelHook and by every detector.
- ``round.py``: one clustering round joining them, and the broadcast of its labels, centroids,
  concentrations and parent maps (padded to the largest k) from rank 0.
"""
from .acceptance import (Acceptance, CalendarAcceptance, ConfidentAcceptance, ConstantAcceptance,
                         LinearAcceptance, StableAcceptance, StepAcceptance, accept_count,
                         accept_top, build_acceptance, match_clusters, unique_labels)
from .kmeans import (BACKEND_TABLE, HIERARCHIES, KMEANS_BACKENDS, KMeansBackend, KMeansResult,
                     assign_by_cosine, check_hierarchy, check_kmeans_options, choose_backend,
                     faiss_gpu_available, kmeans, kmeans_options, multi_level_kmeans,
                     nested_kmeans, resolve_backend, sharding_backend)
from .round import (ROUND_SET_KMEANS_OPTIONS, SCORES, ClusteringRound, broadcast_round,
                    check_round_options, clustering_round, pad_levels, pad_parents, plan_round,
                    round_kmeans_options, round_seed)
from .scores import cluster_confidence, confidence, pcl_concentration

__all__ = [
    'Acceptance', 'CalendarAcceptance', 'ConfidentAcceptance', 'ConstantAcceptance',
    'LinearAcceptance', 'StableAcceptance', 'StepAcceptance', 'accept_count', 'accept_top',
    'build_acceptance', 'match_clusters', 'unique_labels',
    'BACKEND_TABLE', 'HIERARCHIES', 'KMEANS_BACKENDS', 'KMeansBackend', 'KMeansResult',
    'assign_by_cosine', 'check_hierarchy', 'check_kmeans_options', 'choose_backend',
    'faiss_gpu_available', 'kmeans', 'kmeans_options', 'multi_level_kmeans', 'nested_kmeans',
    'resolve_backend', 'sharding_backend',
    'cluster_confidence', 'confidence', 'pcl_concentration',
    'SCORES', 'ROUND_SET_KMEANS_OPTIONS', 'ClusteringRound', 'broadcast_round',
    'check_round_options', 'clustering_round', 'pad_levels', 'pad_parents', 'plan_round',
    'round_kmeans_options', 'round_seed',
]
