"""Clustering quality of pre-trained representations: k-means NMI, as in the paper's table.

For each checkpoint, the training set (from ``--config``, under the eval transform) is encoded,
k-means with k = number of classes runs ``--runs`` times with different seeds, and the NMI
against the ground truth is reported as mean ± std (percent) in a Markdown table.

    python tools/analysis/cluster_table.py work_dirs/a/epoch_8.pth work_dirs/b/epoch_8.pth \\
        --config configs/ifnd/ifnd_r18_demo_fmnist.py --names SimCLR IFND --out table.md
"""
import argparse
import os
import os.path as osp
import sys
import time

from ifnd.clustering import KMEANS_BACKENDS
from ifnd.engine.arguments import (add_encoder_arguments, add_extraction_arguments, check_arguments,
                                   encoder_options, resolve_device)
from ifnd.engine.features import extract_features
from ifnd.evaluation.analysis import (analysis_dataset, cluster_quality_table, default_num_workers,
                                      format_percent, load_feature_model)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='k-means (k = number of classes) on the training-set features of each '
                    'checkpoint, several seeds; NMI mean ± std as a Markdown table.')
    parser.add_argument('checkpoints', nargs='+', metavar='CKPT',
                        help='training checkpoints, backbone files or peer checkpoints (MoCo, PCL, '
                        'solo-learn, mmselfsup, VISSL, torchvision/timm)')
    parser.add_argument('--out', help='also write the Markdown table to this file')
    parser.add_argument('--names', nargs='+',
                        help='row names (default: folder/file of each checkpoint)')
    parser.add_argument('--feature', choices=('f', 'z'), default='f',
                        help="'f': backbone features (any checkpoint; default), 'z': projection "
                        'output (training checkpoints only)')
    parser.add_argument('--runs', type=int, default=5, help='k-means runs, seeds seed..seed+runs-1 '
                        '(default: 5)')
    parser.add_argument('--seed', type=int, default=0, help='first k-means seed (default: 0)')
    parser.add_argument('--num-classes', type=int,
                        help="k (default: the data set's number of classes)")
    parser.add_argument('--kmeans-backend', choices=KMEANS_BACKENDS, default='auto',
                        help='k-means implementation (default: faiss when installed)')
    parser.add_argument('--config', required=True,
                        help='the config that gives the data set and its eval transform (e.g. the '
                        'training config; a checkpoint decides its architecture only)')
    parser.add_argument('--data-root', help="override the data set's data_root")
    add_encoder_arguments(parser)
    add_extraction_arguments(parser, batch_size=256, num_workers=default_num_workers())
    args = parser.parse_args(argv)
    if args.names is not None and len(args.names) != len(args.checkpoints):
        parser.error(f'--names gives {len(args.names)} names for {len(args.checkpoints)} '
                     'checkpoints')
    if args.runs < 1 or (args.num_classes is not None and args.num_classes < 2):
        parser.error('--runs must be >= 1 and --num-classes >= 2')
    return args


def default_name(path: str) -> str:
    """``run_folder/file.pth`` of a checkpoint path."""
    path = osp.abspath(path)
    return f'{osp.basename(osp.dirname(path))}/{osp.basename(path)}'


def evaluate(path: str, args: argparse.Namespace) -> dict:
    """NMI mean and std of one checkpoint, with what it was measured on."""
    loaded = load_feature_model(path, args.feature, args.config, **encoder_options(args))
    dataset = analysis_dataset(loaded.cfg, args.data_root)
    model = loaded.model.to(resolve_device(args.device))
    feats, labels = extract_features(model, dataset, loaded.feature, args.batch_size,
                                     args.num_workers, desc=f'encoding {type(dataset).__name__}',
                                     source=path)
    if len(labels) == 0 or labels.min() < 0:
        raise SystemExit(f'{path}: the data set has images without labels; NMI needs them all')
    k = args.num_classes or getattr(dataset, 'num_classes', None) or int(labels.max()) + 1
    print(f'k-means with k={k} on {len(feats)} {feats.shape[1]}-d features, {args.runs} runs',
          flush=True)
    tic = time.perf_counter()
    mean, std = cluster_quality_table(feats, labels, k, runs=args.runs, seed=args.seed,
                                      backend=args.kmeans_backend)
    print(f'NMI {format_percent(mean, std)} % ({time.perf_counter() - tic:.1f} s)', flush=True)
    split = getattr(dataset, 'split', None)
    data = f'{type(dataset).__name__}{f" {split}" if split else ""}, {len(dataset)} images'
    return dict(nmi_mean=mean, nmi_std=std, k=k, data=data, epoch=loaded.meta.get('epoch'),
                feature=f'{loaded.feature} ({feats.shape[1]}-d)')


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    """The table, with a line saying how it was measured."""
    lines = ['| model | epoch | features | data | k | NMI (%) |', '|---|---|---|---|---|---|']
    for row in rows:
        epoch = '' if row['epoch'] is None else row['epoch']
        lines.append(f'| {row["name"]} | {epoch} | {row["feature"]} | {row["data"]} | {row["k"]} | '
                     f'{format_percent(row["nmi_mean"], row["nmi_std"])} |')
    last = args.seed + args.runs - 1
    seeds = f'seeds {args.seed}..{last}' if args.runs > 1 else f'seed {args.seed}'
    lines += ['', f'k-means with k = number of classes ({args.runs} runs, {seeds}); NMI against '
              'the ground truth, mean ± sample standard deviation over the runs.']
    return '\n'.join(lines) + '\n'


def main(argv: list[str] | None = None) -> list[dict]:
    """Evaluate every checkpoint, print and write the table."""
    args = parse_args(argv)
    check_arguments(inputs={'CKPT': args.checkpoints, '--config': args.config}, outputs={'--out': args.out},
                    batch_size=args.batch_size, num_workers=args.num_workers)
    names = args.names or [default_name(p) for p in args.checkpoints]
    rows = []
    for i, (name, path) in enumerate(zip(names, args.checkpoints), 1):
        print(f'[{i}/{len(names)}] {name}: {path}', flush=True)
        rows.append(dict(name=name, **evaluate(path, args)))
    table = markdown(rows, args)
    print('\n' + table)
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            f.write(table)
        print(f'table written to {args.out}')
    return rows


if __name__ == '__main__':
    try:
        main()
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f'error: {err}')
