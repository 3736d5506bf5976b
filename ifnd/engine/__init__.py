"""Engine pieces: checkpoint safety and feature extraction."""
from .checkpoint import AtomicLocalBackend, SafeLoadRunner, mmengine_checkpoint_globals
from .features import build_eval_dataset, extract_features, unwrap_model

__all__ = ['AtomicLocalBackend', 'SafeLoadRunner', 'mmengine_checkpoint_globals',
           'build_eval_dataset', 'extract_features', 'unwrap_model']
