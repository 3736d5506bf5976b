"""COCO transfer with detectron2, the papers' protocol: the backbone in its weight format, the
config in its terms, and the run.

The torchvision engine's parts are registered components that configs build: the detector
``ifnd.models.detection.MaskRCNN`` and the metric ``ifnd.evaluation.coco.CocoMetric``.
"""
from .detectron2_config import (EXTRA_NORM_HEAD, UnsupportedConfig, dataset_registrations,
                                detectron2_options, write_detectron2_config)
from .detectron2_run import (build_detectron2_config, detectron2_available, register_extra_norm_head,
                             require_detectron2, run_detectron2)
from .detectron2_weights import export_detectron2_weights, from_detectron2, resnet_depth, to_detectron2

__all__ = ['EXTRA_NORM_HEAD', 'UnsupportedConfig', 'dataset_registrations', 'detectron2_options', 'write_detectron2_config',
           'build_detectron2_config', 'detectron2_available', 'register_extra_norm_head',
           'require_detectron2', 'run_detectron2', 'export_detectron2_weights', 'from_detectron2',
           'resnet_depth', 'to_detectron2']
