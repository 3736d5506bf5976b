"""Engine pieces: checkpoint safety, feature extraction and optimiser wrappers."""
from .checkpoint import AtomicLocalBackend, SafeLoadRunner, mmengine_checkpoint_globals
from .features import build_eval_dataset, extract_features, unwrap_model
from .optim import AutoAmpOptimWrapper, amp_options

__all__ = ['AtomicLocalBackend', 'SafeLoadRunner', 'mmengine_checkpoint_globals',
           'build_eval_dataset', 'extract_features', 'unwrap_model', 'AutoAmpOptimWrapper', 'amp_options']
