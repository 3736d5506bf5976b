"""Engine pieces: the training Runner, work-dir runs, feature extraction, optimiser wrappers
and their constructor with layer-wise lr decay.

What the command-line tools share: ``cli.py`` (Runner configs from a file and the tools' choices,
the process group without CUDA), ``config_files.py`` (reading configs), ``config_checks.py``
(``--cfg-options``, value types, top-level keys), ``arguments.py`` (shared flags and their
checks) and ``input_errors.py`` (bad input as one line).
"""
from .features import build_eval_dataset, extract_features, fit_eval_view, unwrap_model
from .layer_decay import LayerDecayOptimWrapperConstructor
from .optim import AutoAmpOptimWrapper, amp_options
from .runner import SafeLoadRunner
from .work_dir import check_new_run, remove_run, resume_checkpoint

__all__ = ['SafeLoadRunner', 'check_new_run', 'remove_run', 'resume_checkpoint',
           'build_eval_dataset', 'extract_features', 'fit_eval_view', 'unwrap_model',
           'AutoAmpOptimWrapper', 'amp_options', 'LayerDecayOptimWrapperConstructor']
