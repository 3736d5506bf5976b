"""Evaluation metrics: false-negative detection rates, cluster quality, weighted kNN."""
from .metrics import (cluster_quality, detection_precision_recall, false_negative_rates,
                      knn_accuracy, knn_classify)
from .classification import Accuracy

__all__ = ['cluster_quality', 'detection_precision_recall', 'false_negative_rates', 'knn_accuracy',
           'knn_classify', 'Accuracy']
from .voc07 import (AP_DEFINITIONS, DEFAULT_SVM_COSTS, VOC07SVMs, evaluate_voc07,  # noqa: E402
                    train_svms, voc07_average_precision, voc07_mean_average_precision)

__all__ += ['AP_DEFINITIONS', 'DEFAULT_SVM_COSTS', 'VOC07SVMs', 'evaluate_voc07', 'train_svms',
            'voc07_average_precision', 'voc07_mean_average_precision']
from .analysis import (RoundQuality, analysis_dataset, cluster_quality_table,  # noqa: E402
                       load_feature_model, nmi_curve, read_round, tsne_embedding)

__all__ += ['RoundQuality', 'analysis_dataset', 'cluster_quality_table', 'load_feature_model',
            'nmi_curve', 'read_round', 'tsne_embedding']
from .coco import CocoMetric, detections_to_coco, evaluate_coco, format_results_table  # noqa: E402

__all__ += ['CocoMetric', 'detections_to_coco', 'evaluate_coco', 'format_results_table']
