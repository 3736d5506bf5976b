"""The false-negative benchmark behind ``python -m benchmarks.false_negatives``, one part per module.

``protocol`` (the methods' records, data sets, presets), ``arguments`` (the command line),
``plan`` (training commands; ``option_checks`` refuses a run's bad options first), ``running``
(subprocesses), ``results`` (reading finished runs), ``merge`` (earlier results' runs,
``--previous``, whose values ``layout`` checks), ``stats`` (error bars), ``report`` (tables and
picture), ``cli`` (all of it in order).
"""
from .arguments import parse_args, resolve_config
from .cli import main
from .merge import check_previous, merge, next_seed, read_previous, settings_differences
from .plan import (augment_options, backbone_options, cfg_options, hook_index, linear_options,
                   load_config, make_plans, train_command, training_data, write_split)
from .protocol import (DATASETS, METHODS, PRESETS, REHEARSAL, VIT_REHEARSAL, Dataset, Method,
                       own_options)
from .report import markdown_tables, plot
from .results import (collect, detection_over_training, final_knn_top1, flagged_negatives,
                      last_round, pick_level, read_scalars)
from .running import TimeLimit, run_plan, training_device
from .stats import fieller_interval, mean_sd, summarise, t_interval

__all__ = ['main', 'check_previous', 'merge', 'next_seed', 'read_previous',
           'settings_differences', 'augment_options', 'backbone_options', 'cfg_options',
           'hook_index', 'linear_options', 'load_config', 'make_plans', 'train_command',
           'training_data', 'write_split', 'DATASETS', 'METHODS', 'PRESETS', 'REHEARSAL',
           'VIT_REHEARSAL', 'Dataset', 'Method', 'own_options', 'parse_args', 'resolve_config', 'markdown_tables',
           'plot', 'collect', 'detection_over_training', 'final_knn_top1', 'flagged_negatives',
           'last_round', 'pick_level', 'read_scalars', 'TimeLimit', 'run_plan', 'training_device',
           'fieller_interval', 'mean_sd', 'summarise', 't_interval']
