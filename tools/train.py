"""Train a model from a config: one process (CPU or one GPU) or one process per GPU."""
import argparse
import os
import os.path as osp

from mmengine.config import Config
from mmengine.runner import Runner

from ifnd.engine.cli import CfgOptionsAction, input_errors_as_messages, runner_config
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


def main(argv: list[str] | None = None) -> None:
    """Build the runner and train; bad input ends with a one-line error."""
    args = parse_args(argv)
    with input_errors_as_messages():
        cfg = build_config(args)
        runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
        runner.train()
    last = osp.join(runner.work_dir, f'epoch_{runner.epoch}.pth')
    if osp.isfile(last):
        runner.logger.info(f'Checkpoint: {osp.abspath(last)}')


if __name__ == '__main__':
    main()
