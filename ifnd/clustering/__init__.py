"""k-means backends, pseudo-label confidence / acceptance, and the clustering round that joins
them, for false negative detection."""
from .kmeans import (KMEANS_BACKENDS, KMeansResult, assign_by_cosine, check_kmeans_options,
                     choose_backend, faiss_gpu_available, kmeans, kmeans_options,
                     multi_level_kmeans, resolve_backend)
from .pseudo_labels import (ACCEPTANCE_SCHEMES, accept_labels, acceptance_rate,
                            cluster_confidence, confidence, pcl_concentration)
from .round import (CONFIDENCES, ROUND_SET_KMEANS_OPTIONS, ClusteringRound, check_round_options,
                    clustering_round, plan_round, round_kmeans_options, round_seed)

__all__ = [
    'KMEANS_BACKENDS', 'KMeansResult', 'assign_by_cosine', 'choose_backend', 'faiss_gpu_available',
    'kmeans', 'kmeans_options', 'check_kmeans_options', 'multi_level_kmeans', 'resolve_backend',
    'ACCEPTANCE_SCHEMES', 'accept_labels', 'acceptance_rate', 'cluster_confidence', 'confidence',
    'pcl_concentration',
    'CONFIDENCES', 'ROUND_SET_KMEANS_OPTIONS', 'ClusteringRound', 'check_round_options',
    'clustering_round', 'plan_round', 'round_kmeans_options', 'round_seed'
]
