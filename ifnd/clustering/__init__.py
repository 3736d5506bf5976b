"""k-means backends and pseudo-label confidence / acceptance for false negative detection."""
from .kmeans import (KMEANS_BACKENDS, KMeansResult, assign_by_cosine, choose_backend,
                     faiss_gpu_available, kmeans, kmeans_options, multi_level_kmeans,
                     resolve_backend)
from .pseudo_labels import (ACCEPTANCE_SCHEMES, accept_labels, acceptance_rate,
                            cluster_confidence, confidence, pcl_concentration)

__all__ = [
    'KMEANS_BACKENDS', 'KMeansResult', 'assign_by_cosine', 'choose_backend', 'faiss_gpu_available',
    'kmeans', 'kmeans_options', 'multi_level_kmeans', 'resolve_backend',
    'ACCEPTANCE_SCHEMES', 'accept_labels', 'acceptance_rate', 'cluster_confidence', 'confidence',
    'pcl_concentration'
]
