"""Fine-tune Mask R-CNN on COCO from a pre-trained checkpoint; report bbox and mask AP (Table 5).

Two engines read the same config (configs/benchmarks/coco/):
  detectron2   the papers' protocol (MoCo's detection code path); needs detectron2 installed
  torchvision  the same architecture from torchvision's detection parts, through mmengine's Runner

Examples:
  # the paper's R50-C4 2x run on 8 GPUs (either engine; see tools/dist_transfer_coco.sh)
  tools/dist_transfer_coco.sh work_dirs/ifnd_r50_200e_in1k/epoch_200.pth 8 --data-root data/coco
  # a CPU-sized check on generated shapes
  python tools/make_coco_shapes.py data/coco_shapes
  python tools/transfer_coco.py CKPT --engine torchvision \\
      --config configs/benchmarks/coco/mask_rcnn_c4_tiny_shapes.py --data-root data/coco_shapes
  # evaluate the fine-tuned detector again
  python tools/transfer_coco.py CKPT --eval-only --work-dir work_dirs/coco/mask_rcnn_r50_c4_2x_coco
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp

import torch
from mmengine.config import Config
from mmengine.dist import get_rank
from mmengine.runner import find_latest_checkpoint

from ifnd.engine.arguments import check_arguments
from ifnd.engine.cli import runner_config
from ifnd.engine.config_checks import CfgOptionsAction
from ifnd.evaluation.coco import RESULTS_FILE, format_results_table
from ifnd.registry import RUNNERS

DEFAULT_CONFIG = 'configs/benchmarks/coco/mask_rcnn_r50_c4_2x_coco.py'
ENGINES = ('detectron2', 'torchvision')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint', help='pre-trained checkpoint: a training checkpoint or '
                        'backbone file of ours, or a MoCo, PCL, solo-learn, mmselfsup, VISSL, '
                        'torchvision/timm ResNet checkpoint')
    parser.add_argument('--config', default=DEFAULT_CONFIG,
                        help=f'transfer config (default: {DEFAULT_CONFIG}, R50-C4 2x)')
    parser.add_argument('--engine', choices=('auto',) + ENGINES, default='auto',
                        help='detectron2 (the papers\' protocol) or torchvision (no extra install); '
                        'auto = detectron2 when it is importable, else torchvision')
    parser.add_argument('--data-root', help='COCO-format data set root holding annotations/'
                        'instances_{train,val}2017.json, train2017/ and val2017/ '
                        '(default: the config\'s, data/coco/); other names through --cfg-options')
    parser.add_argument('--work-dir', help='folder for logs, checkpoints and results '
                        '(default: work_dirs/coco/<config name>)')
    parser.add_argument('--model-name', help='timm backbone name; needed only when the weights leave '
                        'it open (default: the checkpoint\'s config, the config\'s backbone when it '
                        'fits the weights, else the ResNet the weights describe)')
    parser.add_argument('--resume', action='store_true',
                        help='continue from the latest checkpoint in the work dir')
    parser.add_argument('--eval-only', action='store_true',
                        help='evaluate a fine-tuned detector instead of training')
    parser.add_argument('--detector', help='fine-tuned detector checkpoint for --eval-only '
                        '(default: the latest one in the work dir)')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision training')
    parser.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                        help='override config keys, e.g. train_cfg.max_iters=1000 model.norm=BN')
    dist = parser.add_argument_group('distributed (tools/dist_transfer_coco.sh sets these)')
    dist.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                      help='torchvision engine: job launcher (pytorch = torchrun)')
    dist.add_argument('--num-gpus', type=int, default=1,
                      help='detectron2 engine: GPUs per machine (its own launcher starts them)')
    dist.add_argument('--num-machines', type=int, default=1, help='detectron2 engine: machines')
    dist.add_argument('--machine-rank', type=int, default=0,
                      help='detectron2 engine: this machine\'s rank')
    dist.add_argument('--dist-url', default='auto',
                      help='detectron2 engine: rendezvous URL, e.g. tcp://MASTER_ADDR:PORT')
    dist.add_argument('--local_rank', '--local-rank', type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    if args.detector and not args.eval_only:
        parser.error('--detector is for --eval-only; to start from a detector checkpoint use '
                     '--cfg-options load_from=PATH')
    return args


def resolve_engine(name: str) -> str:
    """The engine to run: detectron2 when asked for or, for 'auto', when it is importable."""
    if name == 'auto':
        from ifnd.transfer import detectron2_available
        return 'detectron2' if detectron2_available() else 'torchvision'
    return name


def build_config(args: argparse.Namespace) -> Config:
    """The transfer config with the command line applied (data root, checkpoint, work dir)."""
    work_dir = args.work_dir or osp.join('work_dirs', 'coco',
                                         osp.splitext(osp.basename(args.config))[0])
    cfg = runner_config(args.config, work_dir, 'auto' if args.resume else None, args.amp,
                        args.cfg_options, args.launcher)
    if cfg.model.get('type') != 'MaskRCNN':
        raise SystemExit(f'{args.config} is not a COCO transfer config (model.type MaskRCNN); '
                         'see configs/benchmarks/coco/')
    cfg.model.backbone_checkpoint = args.checkpoint
    if args.model_name:
        cfg.model.backbone.model_name = args.model_name
    if args.data_root:
        for section in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            if section in cfg:
                cfg[section].dataset.data_root = args.data_root
        for section in ('val_evaluator', 'test_evaluator'):
            if section in cfg:
                cfg[section].data_root = args.data_root
    for section in ('val_evaluator', 'test_evaluator'):
        if section in cfg:
            cfg[section].output_dir = cfg.work_dir
            cfg[section].title = osp.basename(args.checkpoint)
    return cfg


def check_norm(cfg: Config) -> None:
    """SyncBN synchronises over GPUs only; say so before a distributed CPU run fails inside torch."""
    if cfg.model.norm == 'SyncBN' and cfg.launcher != 'none' and not torch.cuda.is_available():
        raise SystemExit('model.norm=SyncBN needs GPUs in a distributed run; on CPUs use '
                         '--cfg-options model.norm=BN')


def run_torchvision(cfg: Config, args: argparse.Namespace) -> str:
    """Train (or evaluate) through mmengine's Runner; return the results file."""
    check_norm(cfg)
    if args.eval_only:
        detector = args.detector or find_latest_checkpoint(cfg.work_dir)
        if not detector or not osp.isfile(detector):
            raise SystemExit(f'No detector checkpoint to evaluate: {detector or cfg.work_dir} '
                             '(pass --detector PATH, or train first)')
        cfg.load_from, cfg.resume = detector, False
    runner = RUNNERS.build(cfg)
    if args.eval_only:
        runner.val()
    else:
        runner.train()  # the config evaluates after the last iteration
    return osp.join(cfg.work_dir, RESULTS_FILE)


def main(argv: list[str] | None = None) -> None:
    """Run the transfer with the chosen engine and print the paper's table."""
    args = parse_args(argv)
    check_arguments(inputs={'checkpoint': args.checkpoint})
    engine = resolve_engine(args.engine)
    cfg = build_config(args)
    if engine == 'detectron2':
        from ifnd.transfer import require_detectron2, run_detectron2
        try:
            require_detectron2()
        except ImportError as err:
            raise SystemExit(str(err)) from None
        run_detectron2(cfg, args.checkpoint, cfg.work_dir, data_root=args.data_root,
                       model_name=args.model_name, num_gpus=args.num_gpus,
                       num_machines=args.num_machines, machine_rank=args.machine_rank,
                       dist_url=args.dist_url, resume=args.resume, eval_only=args.eval_only,
                       detector_weights=args.detector, amp=args.amp)
        results_file = osp.join(cfg.work_dir, RESULTS_FILE)
    else:
        results_file = run_torchvision(cfg, args)
    if get_rank() == 0:
        if not osp.isfile(results_file):
            raise SystemExit(f'No results were written to {results_file}')
        with open(results_file) as f:
            results = json.load(f)
        print(f'\nCOCO transfer ({engine} engine, {osp.basename(args.config)}):')
        print(format_results_table(results, osp.basename(args.checkpoint)))
        print(f'Results: {osp.abspath(results_file)}')


if __name__ == '__main__':
    main()
