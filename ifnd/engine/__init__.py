"""Engine pieces: the training Runner, work-dir runs, feature extraction and optimiser wrappers."""
from .features import build_eval_dataset, extract_features, unwrap_model
from .optim import AutoAmpOptimWrapper, amp_options
from .runner import SafeLoadRunner
from .work_dir import check_new_run, remove_run, resume_checkpoint

__all__ = ['SafeLoadRunner', 'check_new_run', 'remove_run', 'resume_checkpoint',
           'build_eval_dataset', 'extract_features', 'unwrap_model', 'AutoAmpOptimWrapper', 'amp_options']
