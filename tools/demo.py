"""The `make demo` run: IFND on Fashion-MNIST on the CPU, ending with a summary table."""
import argparse
import json
import os
import os.path as osp
import time

from mmengine.config import Config

from ifnd.engine.work_dir import hold_work_dir
from ifnd.registry import RUNNERS

DEMO_CONFIG = 'configs/ifnd/ifnd_r18_demo_fmnist.py'
DATA_ROOTS = ('/usr/share/datasets/fashion-mnist', 'data/fashion-mnist')


def find_data_root() -> str:
    """Where Fashion-MNIST is: Debian's package, or torchvision's download under data/."""
    for root in DATA_ROOTS:
        if osp.isdir(root):
            return root
    raise SystemExit('Fashion-MNIST not found in ' + ' or '.join(DATA_ROOTS) + ': run `make data` '
                     '(installs dataset-fashion-mnist, or downloads it with torchvision)')


def summary_table(knn_history: list[float], rounds: list[dict]) -> str:
    """The demo's closing table: kNN top-1 before/after, then one row per clustering round."""
    lines = ['', '| encoder | kNN top-1 (%) |', '|---|---|',
             f'| random init | {knn_history[0]:.2f} |', f'| IFND, trained | {knn_history[-1]:.2f} |',
             '', '| after epoch | k | acceptance rate | NMI | MTPR (%) | MTNR (%) |',
             '|---|---|---|---|---|---|']
    for rnd in rounds:
        for level in rnd['levels']:
            lines.append(f'| {rnd["epoch"]} | {level["k"]} | {level["accept_rate"]:.2f} | '
                         f'{level["nmi"]:.3f} | {level["mtpr"]:.1f} | {level["mtnr"]:.2f} |')
    return '\n'.join(lines)


def main() -> None:
    """Train the demo config and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--config', default=DEMO_CONFIG)
    parser.add_argument('--work-dir', default='work_dirs/ifnd_demo_fmnist')
    parser.add_argument('--data-root', default=None, help='Fashion-MNIST folder (IDX files)')
    args = parser.parse_args()
    data_root = args.data_root or find_data_root()
    cfg = Config.fromfile(args.config)
    cfg.work_dir = args.work_dir
    for dataset in (cfg.train_dataloader.dataset, *(h['val_dataset'] for h in cfg.custom_hooks
                                                     if 'val_dataset' in h)):
        dataset.data_root = data_root
    print(f'>> IFND demo: {args.config} on Fashion-MNIST from {data_root}, work dir {args.work_dir}',
          flush=True)
    start = time.perf_counter()
    with hold_work_dir(cfg.work_dir):  # a second demo at the same time is refused, naming the first
        runner = RUNNERS.build(cfg)
        runner.train()
    knn = list(runner.message_hub.get_scalar('knn/top1').data[0])
    with open(osp.join(runner.work_dir, 'pseudo_labels', 'rounds.json')) as f:
        rounds = json.load(f)
    print(summary_table(knn, rounds))
    ckpt = osp.abspath(osp.join(runner.work_dir, f'epoch_{runner.epoch}.pth'))
    print(f'\nTrained in {(time.perf_counter() - start) / 60:.1f} min. Checkpoint: {ckpt}')
    print(f'Logs and TensorBoard events: {osp.abspath(runner.log_dir)} '
          f'(tensorboard --logdir {os.path.relpath(runner.work_dir)})')


if __name__ == '__main__':
    main()
