"""Runner configs from the command line: a config file with the tools' choices applied, and the
process group started without CUDA."""
import datetime
import os
import os.path as osp
import subprocess

import torch
from mmengine.config import Config

from ifnd.engine.arguments import check_arguments
from ifnd.engine.config_checks import (check_cfg_options, check_cfg_types, check_idle_settings,
                                       check_top_level_keys)
from ifnd.engine.config_files import load_config
from ifnd.engine.optim import amp_options
from ifnd.fileio.former_names import translate_former_config


def runner_config(config: str, work_dir: str | None = None, resume: str | None = None,
                  amp: bool = False, cfg_options: dict | None = None,
                  launcher: str = 'none') -> Config:
    """A Runner config from a file with the usual command-line choices applied.

    ``resume`` is a checkpoint path, or ``'auto'`` for the latest checkpoint in the work dir;
    ``work_dir`` defaults to ``work_dirs/<config name>``.
    """
    if not osp.exists(config):  # something else than a file is named by load_config
        raise SystemExit(f'Config file not found: {config}. Configs live under configs/, '
                         'e.g. configs/ifnd/ifnd_r18_200e_fmnist.py')
    check_arguments(launcher=launcher, folders={'--work-dir': work_dir})
    cfg = load_config(config)
    cfg.launcher = launcher
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    try:
        translated = translate_former_config(cfg.to_dict(), f'config {config}')
    except ValueError as err:
        raise SystemExit(f'error: {err}') from None
    for key in ('model', 'custom_hooks'):
        if key in translated and translated[key] is not cfg.get(key):
            cfg[key] = translated[key]
    check_top_level_keys(cfg)
    check_cfg_types(cfg)
    check_idle_settings(cfg)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(config))[0])
    if amp:
        if not torch.cuda.is_available():
            raise SystemExit('--amp needs a GPU (mmengine\'s AmpOptimWrapper trains in mixed '
                             'precision on GPUs only); leave it out on a CPU')
        wrapper_type = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper_type not in ('OptimWrapper', 'AutoAmpOptimWrapper'):
            raise SystemExit(f'--amp needs optim_wrapper.type OptimWrapper (or AutoAmpOptimWrapper), '
                             f'the config has {wrapper_type}')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        for key, value in amp_options(cfg.optim_wrapper.get('dtype')).items():
            cfg.optim_wrapper.setdefault(key, value)
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        if not osp.isfile(resume):
            raise SystemExit(f'Checkpoint to resume from not found: {resume}')
        cfg.resume = True
        cfg.load_from = resume
    return cfg


def _launcher_variables(launcher: str) -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT from the launcher's own variables, as
    mmengine's ``init_dist`` sets them (torchrun sets them itself)."""
    if launcher == 'slurm':
        addr = subprocess.getoutput(f'scontrol show hostname {os.environ["SLURM_NODELIST"]} | head -n1')
        os.environ.setdefault('MASTER_ADDR', addr)
        os.environ.update(RANK=os.environ['SLURM_PROCID'], WORLD_SIZE=os.environ['SLURM_NTASKS'],
                          LOCAL_RANK=os.environ.get('SLURM_LOCALID', '0'))
    elif launcher == 'mpi':
        if 'MASTER_ADDR' not in os.environ:
            raise SystemExit('error: --launcher mpi needs MASTER_ADDR (the address of rank 0); '
                             'export it before mpirun')
        os.environ.update(RANK=os.environ['OMPI_COMM_WORLD_RANK'],
                          WORLD_SIZE=os.environ['OMPI_COMM_WORLD_SIZE'],
                          LOCAL_RANK=os.environ.get('OMPI_COMM_WORLD_LOCAL_RANK', '0'))
    os.environ.setdefault('MASTER_PORT', '29500')


def init_distributed_without_cuda(cfg: Config, cfg_options: dict | None = None) -> None:
    """Start the process group over gloo when a launcher is set and CUDA is not available.

    mmengine's ``init_dist`` pins each process to a GPU (``torch.cuda.set_device``), which fails
    without one; a group that exists already is kept by ``Runner.setup_env``, so it is made here.
    The runtime config's ``nccl`` is the GPU default and gives way to gloo; ``nccl`` asked for on
    the command line is refused. The model is wrapped in DDP without ``device_ids`` (CPU module).
    With CUDA available nothing changes: mmengine starts the group as configured.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available():
        return
    import torch.distributed as dist
    from mmengine.registry import MODEL_WRAPPERS
    from torch.nn.parallel import DistributedDataParallel

    options = cfg_options or {}
    asked = options.get('env_cfg.dist_cfg.backend',
                        (options.get('env_cfg.dist_cfg') or {}).get('backend',
                        ((options.get('env_cfg') or {}).get('dist_cfg') or {}).get('backend')))
    if asked == 'nccl':
        raise SystemExit('error: env_cfg.dist_cfg.backend=nccl needs CUDA GPUs and none is available '
                         'here; leave the option out (gloo is used on a CPU) or run on a GPU machine')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    dist_cfg = dict(cfg.env_cfg.dist_cfg)
    if dist_cfg.get('backend', 'nccl') == 'nccl':
        dist_cfg['backend'] = 'gloo'
    cfg.env_cfg.dist_cfg = dist_cfg
    wrapper = cfg.get('model_wrapper_cfg') or dict(
        type='MMDistributedDataParallel', broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper_type = MODEL_WRAPPERS.get(wrapper.get('type', 'MMDistributedDataParallel'))
    if isinstance(wrapper_type, type) and issubclass(wrapper_type, DistributedDataParallel):
        wrapper.setdefault('device_ids', None)  # mmengine's default names a GPU: LOCAL_RANK
    cfg.model_wrapper_cfg = wrapper
    if not dist.is_initialized():
        _launcher_variables(launcher)
        kwargs = {k: v for k, v in dist_cfg.items() if k != 'backend'}
        if 'timeout' in kwargs:
            kwargs['timeout'] = datetime.timedelta(seconds=kwargs['timeout'])
        dist.init_process_group(backend=dist_cfg['backend'], init_method='env://', **kwargs)

