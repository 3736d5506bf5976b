"""Train a model from a config: one process (CPU or one GPU) or one process per GPU."""
import argparse
import contextlib
import os
import os.path as osp
import sys

from mmengine.config import Config
from mmengine.runner import Runner

from ifnd.engine import SafeLoadRunner
from ifnd.engine.cli import init_distributed_without_cuda, runner_config
from ifnd.engine.config_checks import CfgOptionsAction
from ifnd.engine.input_errors import input_errors_as_messages
from ifnd.engine.work_dir import (check_new_run, check_written_in_place, differences_from_run, hold_work_dir,
                                  holds_run, inputs_in_run, remove_run, requeue_count)
from ifnd.registry import RUNNERS
from ifnd.zoo.loading import ZOO_PREFIX, checkpoint_path, entry_num_heads

# --resume without a value: the latest checkpoint in the work dir, refused where there is none.
LATEST = 'latest'


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description='Train a contrastive model from a config.')
    parser.add_argument('config', help='config file, e.g. configs/ifnd/ifnd_r18_200e_fmnist.py')
    parser.add_argument('--work-dir', help='folder for logs and checkpoints '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const=LATEST, metavar='CKPT|auto',
                        help='resume from CKPT; without a value, from the latest checkpoint in the '
                        'work dir; "auto": continue the work dir\'s run where it holds one, start '
                        'otherwise (for jobs that are started again after pre-emption)')
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
    # runner_config's 'auto' is the latest checkpoint; --resume auto is settled in prepare_work_dir.
    resume = {LATEST: 'auto', 'auto': None}.get(args.resume, args.resume)
    cfg = runner_config(args.config, args.work_dir, resume, args.amp, args.cfg_options,
                        args.launcher)
    pretrained = (cfg.get('model') or {}).get('pretrained')
    if isinstance(pretrained, str) and pretrained.startswith(ZOO_PREFIX):
        cfg.model.pretrained = zoo_file(pretrained)
        heads = entry_num_heads(pretrained[len(ZOO_PREFIX):])
        if heads is not None and cfg.model.get('pretrained_num_heads') is None:
            cfg.model.pretrained_num_heads = heads  # a ViT's heads, which its weights cannot show
    return cfg


def zoo_file(reference: str) -> str:
    """The downloaded, verified file of ``model.pretrained=zoo:NAME``; a refusal is one line."""
    try:
        return checkpoint_path(reference, progress=process_rank() == '0')
    except (KeyError, RuntimeError) as err:  # an unknown name, an unverifiable file, no source
        raise SystemExit(f'error: model.pretrained={reference}: '
                         f'{" ".join(str(err).strip(chr(34) + chr(39)).split())}') from None


def optimizer_options(cfg_options: dict | None) -> tuple[str, ...]:
    """The optimizer settings given with --cfg-options (``optim_wrapper.optimizer.lr`` -> ``'lr'``)."""
    prefix = 'optim_wrapper.optimizer.'
    return tuple(key[len(prefix):] for key in cfg_options or {}
                 if key.startswith(prefix) and '.' not in key[len(prefix):] and key != prefix + 'type')


def process_rank() -> str:
    """This process's global rank as the launcher set it (before any process group exists)."""
    return os.environ.get('RANK', os.environ.get('SLURM_PROCID',
                                                 os.environ.get('OMPI_COMM_WORLD_RANK', '0')))


def continue_requeued_run(cfg: Config, args: argparse.Namespace) -> None:
    """In a job the scheduler requeued (``SLURM_RESTART_COUNT``), the same command started again after
    a pre-emption: continue the work dir's run, never start it over (--overwrite) or go back to the
    checkpoint the first start named. Only where the work dir holds this very run (config and seed as
    its checkpoint has them): a command started by hand in a requeued allocation is left as it is."""
    restarts, work_dir = requeue_count(), cfg.work_dir
    given = ' '.join(f for f, on in (('--overwrite', args.overwrite),
                                     (f'--resume {args.resume}', args.resume not in (None, 'auto'))) if on)
    differences = differences_from_run(cfg, work_dir)
    if differences:
        shown = ', '.join(differences[:5]) + (f' and {len(differences) - 5} more' if len(differences) > 5 else '')
        args.requeue_note = (f'SLURM_RESTART_COUNT={restarts}, but {work_dir} holds another run (its checkpoint '
                             f'differs in {shown}): not continued as a requeued job; '
                             f'{given or "as the command says"}')
        print(args.requeue_note, file=sys.stderr, flush=True)
        return
    what = ('the run its checkpoint names cannot be compared (no config in it): continuing it'
            if differences is None else 'continuing the run')
    args.requeue_note = f'requeued job (restart {restarts}): {what} in {work_dir}' + (
        f' instead of {given}' if given else '')
    print(args.requeue_note, flush=True)
    print(args.requeue_note, file=sys.stderr, flush=True)
    args.resume, args.overwrite = 'auto', False


def prepare_work_dir(cfg: Config, args: argparse.Namespace) -> None:
    """Settle whether the run starts or continues; refuse a new run in a work dir that holds one,
    and with --overwrite delete that run's files."""
    work_dir = cfg.work_dir
    if args.resume is not None and args.overwrite:
        raise SystemExit('error: --overwrite starts the run over and --resume continues it: '
                         'give one of them')
    check_written_in_place(work_dir)
    if requeue_count() and holds_run(work_dir) and args.resume != LATEST:
        continue_requeued_run(cfg, args)
    if args.resume == 'auto':
        if holds_run(work_dir):
            cfg.resume, cfg.load_from = True, None  # the work dir's latest checkpoint
        else:
            print(f'--resume auto: {work_dir} holds no run yet; starting it', flush=True)
        return
    if args.resume is not None:
        return
    if not args.overwrite:
        check_new_run(work_dir)
        return
    inputs = inputs_in_run(work_dir, cfg.to_dict())
    if inputs:  # a checkpoint to load (load_from, model.pretrained), data, a list file...
        raise SystemExit(f'error: --overwrite would delete what this run reads: {", ".join(inputs)}; '
                         f'copy it out of {work_dir} first, or use another --work-dir')
    if process_rank() == '0':  # one process deletes; the others' runs start empty all the same
        removed, left = remove_run(work_dir)
        for path in removed:
            print(f'--overwrite: deleted {path}', flush=True)
        for entry in left:
            print(f'--overwrite: left {entry}: not a file a run writes', flush=True)


def main(argv: list[str] | None = None) -> None:
    """Build the runner and train; bad input ends with a one-line error."""
    args = parse_args(argv)
    with input_errors_as_messages():
        cfg = build_config(args)
        # One run per work dir, held from before its checks to its end (rank 0 holds it for all).
        holding = hold_work_dir(cfg.work_dir) if process_rank() == '0' else contextlib.nullcontext()
        with holding:
            prepare_work_dir(cfg, args)
            init_distributed_without_cuda(cfg, args.cfg_options)  # CPU processes over gloo
            runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
            if getattr(args, 'requeue_note', None):  # the run's log says it too
                runner.logger.info(args.requeue_note)
            if isinstance(runner, SafeLoadRunner):  # --resume: these values win over the checkpoint's
                runner.resume_optimizer_keys = optimizer_options(args.cfg_options)
            runner.train()
    last = osp.join(runner.work_dir, f'epoch_{runner.epoch}.pth')
    if osp.isfile(last):
        runner.logger.info(f'Checkpoint: {osp.abspath(last)}')


if __name__ == '__main__':
    main()
