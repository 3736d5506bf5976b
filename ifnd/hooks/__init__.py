"""Runner hooks: online kNN evaluation, pseudo-label assignment, false-negative detection quality,
resumable seeding, loss checks, logging without per-step host syncs."""
from .fn_detection_hook import FalseNegativeDetectionHook
from .knn_hook import KNNEvalHook
from .pseudo_label_hook import PseudoLabelHook
from .reliability import ReseedHook, FiniteLossHook
from .runtime_info import BufferedRuntimeInfoHook
from .eval_hooks import FrozenBackboneCheckHook, PreciseBNHook, recompute_bn_statistics, state_fingerprint

__all__ = ['KNNEvalHook', 'PseudoLabelHook', 'FalseNegativeDetectionHook', 'FrozenBackboneCheckHook',
           'PreciseBNHook', 'recompute_bn_statistics', 'state_fingerprint', 'ReseedHook',
           'FiniteLossHook', 'BufferedRuntimeInfoHook']
