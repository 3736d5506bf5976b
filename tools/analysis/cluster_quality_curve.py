"""Clustering quality through training: NMI, MTPR and MTNR of every saved clustering round.

Reads ``WORK_DIR/pseudo_labels/epoch_NNNN.npz`` (written by PseudoLabelHook), recomputes the
quality of each round's k-means assignments against the ground truth, and plots it against the
epoch, one line per level (and per run when several work dirs are given, as in the paper's
comparison of acceptance schemes).

    python tools/analysis/cluster_quality_curve.py work_dirs/ifnd_demo_fmnist \\
        --out curve.png --csv curve.csv
"""
import argparse
import csv
import glob
import os
import os.path as osp
import sys

import matplotlib

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from ifnd.engine.arguments import check_arguments  # noqa: E402
from ifnd.evaluation.analysis import RoundQuality, nmi_curve  # noqa: E402

METRICS = ('nmi', 'ami', 'ari')
LINESTYLES = ('-', '--', ':', '-.')
MARKERS = ('o', 's', '^', 'D', 'v', 'P')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Plot the cluster quality (NMI/AMI/ARI vs ground truth) and the false-negative '
                    'rates MTPR/MTNR of the pseudo labels of every saved clustering round.')
    parser.add_argument('work_dirs', nargs='+', metavar='WORK_DIR',
                        help='training work dir(s), or their pseudo_labels/ folders')
    parser.add_argument('--out', required=True, help='output figure (.png)')
    parser.add_argument('--csv', help='also write every value to this CSV file')
    parser.add_argument('--metric', choices=METRICS, default='nmi',
                        help='cluster-quality score of the first panel (default: nmi)')
    parser.add_argument('--k', type=int, nargs='+',
                        help='only the levels with these numbers of clusters (default: all)')
    parser.add_argument('--labels', nargs='+',
                        help='legend names of the runs (default: folder names)')
    parser.add_argument('--title', help='figure title')
    parser.add_argument('--dpi', type=int, default=120, help='resolution (default: 120)')
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.work_dirs):
        parser.error(f'--labels gives {len(args.labels)} names for {len(args.work_dirs)} work dirs')
    return args


def run_name(path: str) -> str:
    """A run's name: its work dir's folder name."""
    path = osp.normpath(osp.abspath(path))
    return osp.basename(osp.dirname(path)) if osp.basename(path) == 'pseudo_labels' \
        else osp.basename(path)


def write_csv(path: str, runs: dict[str, list[RoundQuality]]) -> None:
    """One row per run, round and level."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(('run', ) + RoundQuality._fields)
        for name, rows in runs.items():
            for row in rows:
                writer.writerow((name, ) + tuple(f'{v:.6g}' if isinstance(v, float) else v
                                                 for v in row))


def plot(runs: dict[str, list[RoundQuality]], metric: str, out: str, title: str | None,
         dpi: int) -> None:
    """Three panels against the epoch: the cluster-quality metric, MTPR (+ rate), MTNR."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.0))
    several = len(runs) > 1
    legend = []  # per run: (label, line) pairs
    for r, (name, rows) in enumerate(runs.items()):
        handles = {}
        ks = sorted({row.k for row in rows})
        for i, k in enumerate(ks):
            level = [row for row in rows if row.k == k]
            epochs = [row.epoch for row in level]
            # One run: a colour per level. Several: a colour per run, a line style per level.
            colour = f'C{r % 10}' if several else f'C{i % 10}'
            style = dict(color=colour, marker=MARKERS[i % len(MARKERS)], markersize=5,
                         linestyle=LINESTYLES[i % len(LINESTYLES)] if several else '-', lw=1.8)
            label = f'{name}, k={k}' if several else f'k = {k}'
            line, = axes[0].plot(epochs, [getattr(row, metric) for row in level], **style)
            axes[1].plot(epochs, [row.mtpr for row in level], **style)
            axes[2].plot(epochs, [row.mtnr for row in level], **style)
            handles[label] = line
        # The acceptance rate is shared by the levels of a run; MTPR cannot exceed it by much.
        rates = sorted({(row.epoch, row.rate) for row in rows})
        rate_label = f'{name}: acceptance rate' if several else 'acceptance rate'
        line, = axes[1].plot([e for e, _ in rates], [100 * v for _, v in rates], linestyle=':',
                             color=f'C{r % 10}' if several else '0.45', alpha=0.6 if several else 1,
                             lw=1.5)
        handles[rate_label] = line
        legend.append(list(handles.items()))
    names = {'nmi': 'NMI', 'ami': 'AMI', 'ari': 'ARI'}
    axes[0].set_ylabel(f'{names[metric]} of k-means vs ground truth')
    axes[0].set_title(f'Cluster quality ({names[metric]})')
    axes[1].set_ylabel('MTPR / acceptance rate (%)')
    axes[1].set_title('MTPR: false negatives detected')
    axes[2].set_ylabel('MTNR (%)')
    axes[2].set_title('MTNR: true negatives kept')
    epochs = sorted({row.epoch for rows in runs.values() for row in rows})
    for ax in axes:
        ax.set_xlabel('epochs trained (clustering round)')
        ax.grid(alpha=0.3)
        if len(epochs) <= 12:
            ax.set_xticks(epochs)
    axes[1].set_ylim(-2, 102)
    if several:
        # Legends fill column by column: interleave the runs so that each run is one row.
        ncol = max(len(entries) for entries in legend)
        entries = [run[i] for i in range(ncol) for run in legend if i < len(run)]
        legend_rows = len(legend)
    else:
        entries = legend[0]
        ncol = min(len(entries), 6)
        legend_rows = -(-len(entries) // 6)
    fig.legend([line for _, line in entries], [label for label, _ in entries], loc='lower center',
               ncol=ncol, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06 * legend_rows + 0.02, 1, 1))
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, list[RoundQuality]]:
    """Read the rounds, print them, write the CSV and the figure."""
    args = parse_args(argv)
    # The rounds read from each work dir must not be overwritten by --out or --csv.
    rounds = [f for d in args.work_dirs for f in sorted(glob.glob(osp.join(d, '*.npz'))
                                                        + glob.glob(osp.join(d, 'pseudo_labels', '*.npz')))]
    check_arguments(inputs={'WORK_DIR': rounds}, outputs={'--out': args.out, '--csv': args.csv})
    names = args.labels or [run_name(d) for d in args.work_dirs]
    if len(set(names)) != len(names):
        raise SystemExit(f'two runs share a name ({", ".join(names)}): name them with --labels')
    runs = {}
    for name, work_dir in zip(names, args.work_dirs):
        print(f'reading clustering rounds of {name} from {work_dir}', flush=True)
        rows = nmi_curve(work_dir)
        if args.k:
            rows = [row for row in rows if row.k in args.k]
            if not rows:
                raise SystemExit(f'{work_dir} has no level with k in {args.k}')
        runs[name] = rows
        print('| epoch | k | rate | NMI | AMI | ARI | MTPR (%) | MTNR (%) |\n'
              '|---|---|---|---|---|---|---|---|')
        for row in rows:
            print(f'| {row.epoch} | {row.k} | {row.rate:.2f} | {row.nmi:.3f} | {row.ami:.3f} | '
                  f'{row.ari:.3f} | {row.mtpr:.1f} | {row.mtnr:.2f} |')
    if args.csv:
        write_csv(args.csv, runs)
        print(f'values written to {args.csv}')
    plot(runs, args.metric, args.out, args.title, args.dpi)
    print(f'figure written to {args.out}')
    return runs


if __name__ == '__main__':
    try:
        main()
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f'error: {err}')
