"""Train a model from a config: one process (CPU or one GPU) or one process per GPU."""
import argparse
import os
import os.path as osp

from mmengine.config import Config
from mmengine.runner import Runner

from ifnd.engine import SafeLoadRunner
from ifnd.engine.cli import (CfgOptionsAction, init_distributed_without_cuda, input_errors_as_messages,
                             runner_config)
from ifnd.engine.work_dir import check_new_run, remove_run, run_files
from ifnd.registry import RUNNERS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description='Train a contrastive model from a config.')
    parser.add_argument('config', help='config file, e.g. configs/ifnd/ifnd_r18_200e_fmnist.py')
    parser.add_argument('--work-dir', help='folder for logs and checkpoints '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or from the latest checkpoint in the work dir '
                        'when no path is given')
    parser.add_argument('--overwrite', action='store_true',
                        help='start a new run in a work dir that holds one: first delete its '
                        'checkpoints, last_checkpoint and pseudo labels (logs stay); without it '
                        'such a work dir is refused')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision')
    parser.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                        help='override config keys, e.g. train_cfg.max_epochs=10 '
                        'custom_hooks.0.scheme=step')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher (pytorch = torchrun)')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_config(args: argparse.Namespace) -> Config:
    """The config with the command line applied."""
    return runner_config(args.config, args.work_dir, args.resume, args.amp, args.cfg_options,
                         args.launcher)


def optimizer_options(cfg_options: dict | None) -> tuple[str, ...]:
    """The optimizer settings given with --cfg-options (``optim_wrapper.optimizer.lr`` -> ``'lr'``)."""
    prefix = 'optim_wrapper.optimizer.'
    return tuple(key[len(prefix):] for key in cfg_options or {}
                 if key.startswith(prefix) and '.' not in key[len(prefix):] and key != prefix + 'type')


def prepare_work_dir(cfg: Config, args: argparse.Namespace) -> None:
    """Refuse a new run in a work dir that holds one; with --overwrite, delete that run's files."""
    if args.resume is not None:
        if args.overwrite:
            raise SystemExit('error: --overwrite starts the run over and --resume continues it: '
                             'give one of them')
        return
    if not args.overwrite:
        check_new_run(cfg.work_dir)
        return
    load_from = cfg.get('load_from')
    if load_from and osp.realpath(load_from) in {osp.realpath(p) for p in run_files(cfg.work_dir)}:
        raise SystemExit(f'error: --overwrite would delete {load_from}, the checkpoint load_from '
                         f'names: copy it out of {cfg.work_dir} first, or use another --work-dir')
    rank = os.environ.get('RANK', os.environ.get('SLURM_PROCID',
                                                 os.environ.get('OMPI_COMM_WORLD_RANK', '0')))
    if rank == '0':  # one process deletes; the others' runs start empty all the same
        removed = remove_run(cfg.work_dir)
        if removed:
            print(f'--overwrite: deleted the earlier run in {cfg.work_dir} ({len(removed)} files: '
                  'checkpoints, last_checkpoint, pseudo labels)', flush=True)


def main(argv: list[str] | None = None) -> None:
    """Build the runner and train; bad input ends with a one-line error."""
    args = parse_args(argv)
    with input_errors_as_messages():
        cfg = build_config(args)
        prepare_work_dir(cfg, args)
        init_distributed_without_cuda(cfg, args.cfg_options)  # CPU processes over gloo
        runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
        if isinstance(runner, SafeLoadRunner):  # --resume: these values win over the checkpoint's
            runner.resume_optimizer_keys = optimizer_options(args.cfg_options)
        runner.train()
    last = osp.join(runner.work_dir, f'epoch_{runner.epoch}.pth')
    if osp.isfile(last):
        runner.logger.info(f'Checkpoint: {osp.abspath(last)}')


if __name__ == '__main__':
    main()
