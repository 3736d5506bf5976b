"""Evaluation metrics: false-negative detection rates, cluster quality, weighted kNN."""
from .metrics import (cluster_quality, false_negative_rates, knn_accuracy, knn_classify)

__all__ = ['cluster_quality', 'false_negative_rates', 'knn_accuracy', 'knn_classify']
