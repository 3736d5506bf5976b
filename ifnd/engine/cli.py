"""Helpers shared by the command-line tools: device choice, JSON results, Runner configs."""
import argparse
import json
import os.path as osp

import torch
from mmengine.config import Config

from ifnd.engine.checkpoint import AtomicLocalBackend


def resolve_device(name: str) -> torch.device:
    """The device to run on: CUDA when available for 'auto'."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    device = torch.device(name)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda was asked for but CUDA is not available')
    return device


def write_json(result: dict | list, path: str, indent: int | None = 2) -> None:
    """Write results as JSON atomically (the folder is created), and say where."""
    AtomicLocalBackend().put_text(json.dumps(result, indent=indent), path)
    print(f'Results written to {path}')


def runner_config(config: str, work_dir: str | None = None, resume: str | None = None,
                  amp: bool = False, cfg_options: dict | None = None,
                  launcher: str = 'none') -> Config:
    """A Runner config from a file with the usual command-line choices applied.

    ``resume`` is a checkpoint path, or ``'auto'`` for the latest checkpoint in the work dir;
    ``work_dir`` defaults to ``work_dirs/<config name>``.
    """
    if not osp.isfile(config):
        raise SystemExit(f'Config file not found: {config}. Configs live under configs/, '
                         'e.g. configs/ifnd/ifnd_r18_200e_fmnist.py')
    cfg = Config.fromfile(config)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(config))[0])
    if amp:
        if not torch.cuda.is_available():
            raise SystemExit('--amp needs a GPU (mmengine\'s AmpOptimWrapper trains in mixed '
                             'precision on GPUs only); leave it out on a CPU')
        if cfg.optim_wrapper.get('type', 'OptimWrapper') != 'OptimWrapper':
            raise SystemExit(f'--amp needs optim_wrapper.type OptimWrapper, '
                             f'the config has {cfg.optim_wrapper.type}')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        if not osp.isfile(resume):
            raise SystemExit(f'Checkpoint to resume from not found: {resume}')
        cfg.resume = True
        cfg.load_from = resume
    return cfg


def add_encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model-name`` and ``--cifar-stem``: override the backbone a checkpoint carries or implies."""
    parser.add_argument('--model-name',
                        help='timm backbone name; needed only when the weights leave it open '
                        '(default: the checkpoint\'s config, else the ResNet its weights describe)')
    parser.add_argument('--cifar-stem', action=argparse.BooleanOptionalAction, default=None,
                        help='override the checkpoint: 3x3 stride-1 stem without max-pooling')


def add_extraction_arguments(parser: argparse.ArgumentParser, batch_size: int,
                             num_workers: int) -> None:
    """``--batch-size``, ``--num-workers`` and ``--device`` of feature extraction."""
    parser.add_argument('--batch-size', type=int, default=batch_size,
                        help='feature extraction batch (default: %(default)s)')
    parser.add_argument('--num-workers', type=int, default=num_workers,
                        help='data loading workers (default: %(default)s)')
    parser.add_argument('--device', default='auto',
                        help="'auto' (CUDA when available), 'cpu' or 'cuda'")
