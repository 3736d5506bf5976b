"""Write a class-balanced subset list of a config's data set, reproducible by seed.

Each class keeps ``round(fraction * n_c)`` (at least one) of its samples, drawn with ``--seed``.
Entries are file paths relative to the data set's root for file-based data sets (ImageNet,
ImageFolder) and sample indices for in-memory ones (CIFAR, Fashion-MNIST, digits); any data set's
``subset_file`` reads the result back.

    python tools/make_subset.py --config configs/benchmarks/semi/semi_r18_20e_fmnist_1pct.py \
        --fraction 0.01 --seed 0 --out data/fmnist_1pct_seed0.txt
"""
from __future__ import annotations

import argparse
import copy
import os.path as osp

import numpy as np
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope

from ifnd.datasets import balanced_subset_indices
from ifnd.engine.arguments import check_arguments
from ifnd.fileio import AtomicLocalBackend
from ifnd.registry import DATASETS

SUBSET_KEYS = ('subset_fraction', 'subset_file', 'subset_seed')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description='Write a class-balanced subset list file.')
    parser.add_argument('--config', required=True, help='config whose data set is subsetted')
    parser.add_argument('--fraction', type=float, required=True, help='fraction of each class, in (0, 1]')
    parser.add_argument('--seed', type=int, default=0, help='random seed of the draw')
    parser.add_argument('--out', required=True, help='output list file')
    parser.add_argument('--dataset', default='train_dataloader.dataset',
                        help='config key of the data set (default: train_dataloader.dataset)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config keys, e.g. train_dataloader.dataset.data_root=DIR')
    return parser.parse_args(argv)


def dataset_config(cfg: Config, key: str) -> dict:
    """The data set config at ``key`` with any subsetting removed (the draw is over all of it)."""
    node = cfg
    for part in key.split('.'):
        if part not in node:
            raise KeyError(f"the config has no '{key}' (missing '{part}')")
        node = node[part]
    dataset = copy.deepcopy(node.to_dict() if hasattr(node, 'to_dict') else dict(node))
    for name in SUBSET_KEYS:
        dataset.pop(name, None)
    dataset['pipeline'] = None  # images are never read
    return dataset


def subset_entries(dataset, fraction: float, seed: int) -> tuple[list[str], np.ndarray]:
    """The list-file entries of a balanced subset of ``dataset`` and their sample indices."""
    labels = np.asarray(dataset.labels)
    if labels.size and (labels < 0).any():
        raise ValueError(f'{int((labels < 0).sum())} samples have no label (-1): a class-balanced '
                         'subset needs a labelled data set (e.g. a list file with labels)')
    indices = balanced_subset_indices(labels, fraction, seed)
    names = getattr(dataset, '_all_names', None)
    if names is not None:
        names = list(names)
        entries = [names[int(dataset.indices[i])] for i in indices]
    else:
        entries = [str(int(dataset.indices[i])) for i in indices]
    return entries, indices


def make_subset(config: str, fraction: float, seed: int, out: str,
                dataset_key: str = 'train_dataloader.dataset', cfg_options: dict | None = None) -> list[str]:
    """Write the subset list file ``out`` (atomically) and return its entries."""
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    init_default_scope(cfg.get('default_scope', 'ifnd'))
    dataset_cfg = dataset_config(cfg, dataset_key)
    ann_file, root = dataset_cfg.get('ann_file'), dataset_cfg.get('data_root')
    if ann_file:  # the list file the data set reads: --out must not replace it
        ann_path = ann_file if osp.isabs(ann_file) or not root else osp.join(str(root), ann_file)
        check_arguments(inputs={f'{dataset_key}.ann_file': ann_path}, outputs={'--out': out})
    dataset = DATASETS.build(dataset_cfg)
    entries, indices = subset_entries(dataset, fraction, seed)
    _, counts = np.unique(np.asarray(dataset.labels)[indices], return_counts=True)
    file_based = getattr(dataset, '_all_names', None) is not None
    header = [f'# class-balanced subset of {dataset_cfg["type"]} from {config} ({dataset_key})',
              f'# fraction {fraction}, seed {seed}: {len(entries)} of {len(dataset)} samples, '
              f'{counts.min()}-{counts.max()} per class',
              '# entries: ' + ('file paths relative to the data root' if file_based else 'sample indices')]
    AtomicLocalBackend().put_text('\n'.join(header + entries) + '\n', out)
    return entries


def main(argv: list[str] | None = None) -> None:
    """Write the list file and report its size."""
    args = parse_args(argv)
    check_arguments(inputs={'--config': args.config}, outputs={'--out': args.out})
    entries = make_subset(args.config, args.fraction, args.seed, args.out, args.dataset, args.cfg_options)
    print(f'{args.out}: {len(entries)} entries (fraction {args.fraction}, seed {args.seed})')


if __name__ == '__main__':
    main()
