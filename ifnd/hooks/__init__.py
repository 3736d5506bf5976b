"""Runner hooks: online kNN evaluation, pseudo-label assignment, false-negative detection quality,
resumable seeding, loss checks, logging without per-step host syncs."""
from .bn_stats import SyncBNStatsHook, average_bn_statistics
from .fn_detection_hook import FalseNegativeDetectionHook
from .knn_hook import KNNEvalHook
from .momentum import MomentumScheduleHook
from .negative_detector import NegativeDetectorHook
from .pseudo_label_hook import PseudoLabelHook
from .reliability import ReseedHook, FiniteLossHook, LogFileErrorHook
from .runtime_info import BufferedRuntimeInfoHook
from .eval_hooks import (ClassMatchHook, FrozenBackboneCheckHook, PreciseBNHook, PretrainedFeaturesHook,
                         recompute_bn_statistics, state_fingerprint)

__all__ = ['ClassMatchHook', 'KNNEvalHook', 'MomentumScheduleHook', 'NegativeDetectorHook', 'PseudoLabelHook', 'FalseNegativeDetectionHook', 'FrozenBackboneCheckHook',
           'PreciseBNHook', 'PretrainedFeaturesHook', 'recompute_bn_statistics', 'state_fingerprint', 'ReseedHook',
           'FiniteLossHook', 'LogFileErrorHook', 'BufferedRuntimeInfoHook', 'SyncBNStatsHook', 'average_bn_statistics']
