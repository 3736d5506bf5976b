"""t-SNE map of a checkpoint's embedding space, coloured by ground truth and by pseudo labels.

A seeded sample of the training images (the set the clustering rounds used, under their eval
transform, both from ``--config``, the config it was trained with) is encoded by the checkpoint
and mapped with t-SNE.
The first panel colours it by ground truth; each ``--rounds`` file adds a panel coloured by that
round's pseudo labels (unaccepted samples light grey, centroids marked x), as in the paper's
visualisation of IFND through training.

    python tools/analysis/plot_embeddings.py work_dirs/ifnd_demo_fmnist/epoch_8.pth \\
        --config configs/ifnd/ifnd_r18_demo_fmnist.py \\
        --rounds work_dirs/ifnd_demo_fmnist/pseudo_labels/epoch_000{2,4,8}.npz --out fig.png
"""
import argparse
import math
import os
import os.path as osp
import sys
import textwrap
import time

import matplotlib

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from torch.utils.data import Subset  # noqa: E402

from ifnd.engine.arguments import (add_encoder_arguments, add_extraction_arguments, check_arguments,  # noqa: E402
                                   encoder_options, resolve_device)
from ifnd.engine.features import extract_features  # noqa: E402
from ifnd.evaluation.analysis import (  # noqa: E402
    analysis_dataset, default_num_workers, find_hook, load_feature_model, match_clusters_to_classes,
    member_centroids, read_round, sample_indices, tsne_embedding)

UNACCEPTED = '#d4d4d4'
LEGEND_WIDTH = 2.3  # inches added on the right for the legend when no panel cell is free


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='t-SNE of training-set features of a checkpoint, coloured by ground truth and '
                    'by the pseudo labels of saved clustering rounds (one panel per round).')
    parser.add_argument('checkpoint', help='training checkpoint; with --feature f, also a backbone '
                        'file or peer checkpoint')
    parser.add_argument('--rounds', nargs='+', default=[], metavar='NPZ',
                        help='clustering rounds to show: work_dir/pseudo_labels/epoch_NNNN.npz')
    parser.add_argument('--out', required=True, help='output figure (.png)')
    parser.add_argument('--num-points', type=int, default=2000,
                        help='training images in the map (default: 2000)')
    parser.add_argument('--feature', choices=('z', 'f'),
                        help="'z': L2-normalised projection output, 'f': backbone features "
                        "(default: what the run's PseudoLabelHook clustered, else z)")
    parser.add_argument('--level', type=int, default=0,
                        help='clustering level of the rounds to show (index into num_clusters; '
                        'default: 0)')
    parser.add_argument('--seed', type=int, default=0, help='sample and t-SNE seed (default: 0)')
    parser.add_argument('--perplexity', type=float, default=30.0,
                        help='t-SNE perplexity (default: 30)')
    parser.add_argument('--tsne-iter', type=int, default=1000,
                        help='t-SNE iterations, at least 250 (default: 1000)')
    parser.add_argument('--threads', type=int,
                        help="CPU threads for t-SNE (default: all; 1 is often faster on a busy "
                        'machine)')
    parser.add_argument('--data-root', help="override the data set's data_root")
    parser.add_argument('--config', required=True,
                        help='the config that gives the data set and its eval transform (the one '
                        'the checkpoint was trained with; a checkpoint decides its architecture only)')
    parser.add_argument('--ncols', type=int, default=3, help='panels per row (default: 3)')
    parser.add_argument('--title', help='figure title')
    parser.add_argument('--dpi', type=int, default=100, help='resolution (default: 100)')
    add_encoder_arguments(parser)
    add_extraction_arguments(parser, batch_size=256, num_workers=default_num_workers())
    args = parser.parse_args(argv)
    if args.num_points < 4 or args.tsne_iter < 250 or args.ncols < 1 or args.level < 0 \
            or (args.threads is not None and args.threads < 1):
        parser.error('--num-points must be >= 4, --tsne-iter >= 250, --ncols >= 1, --level >= 0, '
                     '--threads >= 1')
    return args


def palette(num: int) -> list:
    """``num`` distinguishable colours (tab10 / tab20, else samples of a rainbow map)."""
    if num <= 10:
        return list(plt.get_cmap('tab10').colors[:num])
    if num <= 20:
        return list(plt.get_cmap('tab20').colors[:num])
    return [plt.get_cmap('turbo')(x) for x in np.linspace(0.05, 0.95, num)]


def round_centroids(rnd: dict, level: int, feats: np.ndarray, indices: np.ndarray, feature: str,
                    hook_feature: str, ckpt_epoch: int | None) -> tuple[np.ndarray, str]:
    """The centroids to mark for a round, in the plotted feature space, and where they came from.

    The saved centroids live in the space of the model that ran the round: they are used when
    that is the checkpoint's own space (same epoch and feature). Otherwise each cluster is marked
    at the normalised mean of its sampled members' features, the k-means centroid as this
    checkpoint sees it.
    """
    saved = rnd['centroids'][level]
    if saved is not None and rnd['epoch'] == ckpt_epoch and feature == hook_feature \
            and saved.ndim == 2 and saved.shape[1] == feats.shape[1]:
        return saved.astype(np.float32), 'saved by the round'
    _, cents = member_centroids(feats, rnd['assignments'][level][indices],
                                rnd['num_clusters'][level])
    return cents, 'mean of sampled members'


def draw_centroids(ax, xy: np.ndarray, size: float) -> None:
    """Black x marks with a white halo, visible on any colour."""
    ax.scatter(xy[:, 0], xy[:, 1], marker='x', s=size, c='white', linewidths=4.0, zorder=3)
    ax.scatter(xy[:, 0], xy[:, 1], marker='x', s=size, c='black', linewidths=1.8, zorder=4)


def plot(coords: np.ndarray, truth: np.ndarray, class_names: list[str], panels: list[dict],
         args: argparse.Namespace, title: str) -> None:
    """Ground-truth panel, then one pseudo-label panel per round; legend in a spare cell."""
    num = len(truth)
    xy = coords[:num]
    colours = np.asarray(palette(len(class_names)))
    size = float(np.clip(8000.0 / num, 1.0, 14.0))
    count = 1 + len(panels)
    ncols = min(args.ncols, count)
    nrows = math.ceil(count / ncols)
    spare = nrows * ncols > count
    width = 4.3 * ncols + (0 if spare else LEGEND_WIDTH)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 4.3 * nrows + 0.9),
                             sharex=True, sharey=True, squeeze=False)
    axes = axes.ravel()
    ax = axes[0]
    order = np.random.default_rng(args.seed).permutation(num)  # no class drawn over all others
    ax.scatter(xy[order, 0], xy[order, 1], s=size, c=colours[truth[order]], linewidths=0)
    ax.set_title(f'ground truth\n{len(class_names)} classes', fontsize=11)
    for ax, panel in zip(axes[1:], panels):
        labels = panel['labels']
        accepted = labels >= 0
        ax.scatter(xy[~accepted, 0], xy[~accepted, 1], s=size, c=UNACCEPTED, linewidths=0)
        idx = order[accepted[order]]
        ax.scatter(xy[idx, 0], xy[idx, 1], s=size, c=colours[panel['slots'][labels[idx]]],
                   linewidths=0)
        draw_centroids(ax, coords[panel['extra']], 70 if len(panel['extra']) <= 30 else 30)
        ax.set_title(f'pseudo labels, round after epoch {panel["epoch"]}\n'
                     f'k = {panel["k"]}, acceptance rate {panel["rate"]:.0%}', fontsize=11)
    for ax in axes[:count]:
        ax.set_xticks([])
        ax.set_yticks([])
    right = _legend_and_note(fig, axes, count, spare, colours, class_names, bool(panels), title)
    fig.tight_layout(rect=(0, 0, right, 0.97))
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=args.dpi)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    """Encode a sample, embed it with t-SNE together with the centroids, draw the panels."""
    args = parse_args(argv)
    check_arguments(inputs={'checkpoint': args.checkpoint, '--rounds': args.rounds, '--config': args.config},
                    outputs={'--out': args.out},
                    batch_size=args.batch_size, num_workers=args.num_workers)
    tic = time.perf_counter()
    print(f'loading {args.checkpoint}', flush=True)
    loaded = load_feature_model(args.checkpoint, args.feature, args.config, **encoder_options(args))
    hook_feature = (find_hook(loaded.cfg, 'PseudoLabelHook') or {}).get('feature', 'z')
    dataset = analysis_dataset(loaded.cfg, args.data_root)
    num = len(dataset)
    rounds = _read_rounds(args, num)
    indices = sample_indices(num, args.num_points, args.seed)
    model = loaded.model.to(resolve_device(args.device))
    feats, truth = extract_features(model, Subset(dataset, indices.tolist()), loaded.feature,
                                    args.batch_size, args.num_workers,
                                    desc=f'encoding a sample of {type(dataset).__name__}',
                                    source=args.checkpoint)
    feats, truth = feats.numpy(), truth.numpy()
    if truth.min() < 0:
        raise SystemExit('the data set has images without labels; the map is coloured by them')
    for rnd in rounds:
        if not np.array_equal(rnd['true_labels'][indices], truth):
            raise SystemExit(f'{rnd["path"]}: its ground truth differs from the data set\'s, so '
                             'its samples are in another order or from another data set')

    ckpt_epoch = loaded.meta.get('epoch')
    extras, panels, start = _round_panels(rounds, args, feats, indices, truth, loaded, hook_feature,
                                          ckpt_epoch)
    extra = np.concatenate(extras) if extras else None
    print(f't-SNE of {len(feats)} points{f" and {start - len(feats)} centroids" if extras else ""} '
          f'({feats.shape[1]}-d {loaded.feature} features)', flush=True)
    coords, _ = tsne_embedding(feats, len(feats), args.seed, extra=extra,
                               perplexity=args.perplexity, max_iter=args.tsne_iter,
                               threads=args.threads)
    classes = getattr(dataset, 'classes', None)
    num_classes = max(int(truth.max()) + 1, len(classes or []))
    class_names = list(classes) if classes and len(classes) == num_classes \
        else [f'class {c}' for c in range(num_classes)]
    epoch_text = f', epoch {ckpt_epoch}' if ckpt_epoch is not None else ''
    title = args.title or (f't-SNE of {len(feats)} training images: {loaded.feature} features of '
                           f'{osp.basename(args.checkpoint)}{epoch_text}')
    plot(coords, truth, class_names, panels, args, title)
    print(f'figure written to {args.out} ({time.perf_counter() - tic:.0f} s)')
    return dict(coords=coords, indices=indices, truth=truth)



def _legend_and_note(fig, axes: np.ndarray, count: int, spare: bool, colours: np.ndarray,
                     class_names: list[str], with_panels: bool, title: str) -> float:
    """The title, the class legend and the note on colours, the last two in a spare cell or a
    column of their own; the figure's right edge left to the panels."""
    handles = [Line2D([], [], ls='', marker='o', ms=7, color=colours[c], label=name)
               for c, name in enumerate(class_names)]
    if with_panels:
        handles += [Line2D([], [], ls='', marker='o', ms=7, color=UNACCEPTED, label='not accepted'),
                    Line2D([], [], ls='', marker='x', ms=8, mew=2, color='black', label='centroid')]
    for ax in axes[count:]:
        ax.axis('off')
    note = ('Pseudo-label panels: each cluster takes the colour of the class it is matched to by '
            'overlap (one-to-one when k <= classes, else its majority class); a colour that '
            'differs from the ground truth marks a cluster that mixes or splits classes.'
            ) if with_panels else ''
    fig.suptitle(title, fontsize=12)
    legend = dict(handles=handles, frameon=False, fontsize=10, title='class / cluster colour',
                  ncol=1 if len(handles) <= 14 else 2)
    if spare:  # legend and note in the first empty cell
        cell = axes[count]
        cell.legend(loc='center', bbox_to_anchor=(0.5, 0.6), **legend)
        if note:
            cell.text(0.5, 0.0, textwrap.fill(note, 52), transform=cell.transAxes, ha='center',
                      va='bottom', fontsize=9, color='0.3')
        right = 1.0
    else:  # a column of its own on the right
        right = 1.0 - LEGEND_WIDTH / fig.get_figwidth()
        fig.legend(loc='center left', bbox_to_anchor=(right, 0.6), **legend)
        if note:
            fig.text(right + 0.01, 0.03, textwrap.fill(note, 30), ha='left', va='bottom',
                     fontsize=8, color='0.3')
    return right


def _read_rounds(args: argparse.Namespace, num: int) -> list[dict]:
    """The ``--rounds`` files, refused when they label another data set or lack ``--level``."""
    rounds = []
    for path in args.rounds:
        rnd = read_round(path)
        if rnd['labels'].shape[1] != num:
            raise SystemExit(f'{path} labels {rnd["labels"].shape[1]} samples but the data set '
                             f'of the checkpoint has {num}: the round belongs to another run or '
                             'data set (check --data-root / --config)')
        if args.level >= len(rnd['num_clusters']):
            raise SystemExit(f'{path} has {len(rnd["num_clusters"])} levels; --level '
                             f'{args.level} does not exist')
        rounds.append(rnd)
    return rounds


def _round_panels(rounds: list[dict], args: argparse.Namespace, feats: np.ndarray, indices: np.ndarray,
                  truth: np.ndarray, loaded, hook_feature: str, ckpt_epoch: int | None
                  ) -> tuple[list[np.ndarray], list[dict], int]:
    """Each round's centroids and panel; the index after the last centroid in the embedded points."""
    extras, panels, start = [], [], len(feats)
    for rnd in rounds:
        cents, source = round_centroids(rnd, args.level, feats, indices, loaded.feature,
                                        hook_feature, ckpt_epoch)
        k = rnd['num_clusters'][args.level]
        labels = rnd['labels'][args.level][indices]
        num_classes = int(max(truth.max(), rnd['true_labels'].max())) + 1
        # Colours from the whole round's labels, not only the sample's: stable across --num-points.
        slots = match_clusters_to_classes(rnd['labels'][args.level], rnd['true_labels'], k,
                                          num_classes, one_to_one=k <= num_classes)
        print(f'round after epoch {rnd["epoch"]}: k={k}, rate {rnd["rate"]:.2f}, '
              f'{len(cents)} centroids ({source})', flush=True)
        panels.append(dict(labels=labels, slots=slots, k=k, rate=rnd['rate'], epoch=rnd['epoch'],
                           extra=np.arange(start, start + len(cents))))
        extras.append(cents)
        start += len(cents)
    return extras, panels, start


if __name__ == '__main__':
    try:
        main()
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f'error: {err}')
