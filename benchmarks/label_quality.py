"""How precise IFND's accepted pseudo labels are with nested levels against independent ones, on
the same features.

For every clustering round of an IFND run that left a checkpoint of its epoch, the model is rebuilt
from that checkpoint (``load_feature_model``) and the training set encoded as the round encoded it,
by the run's own config (its PseudoLabelHook's data set, eval view, feature and extraction batch).
The features are then clustered twice by ``clustering_round``, with the round's seed, k-means
options, τ and acceptance: the levels independent at the run's ``num_clusters`` (IFND's; for an
independent run, the run's own round again: the share of its labels reproduced is reported) and
nested at the same k, fine to coarse (HCSC's hierarchical k-means). Per level k: the pair
precision and recall (with MTPR / MTNR) of the labels accepted at the round's rate, and the
precision-recall curve over a sweep of acceptance rates (the round's κ ranking, cut at each
rate), so that the hierarchies are compared at matched recall: nested's precision interpolated
at independent's recall at the round's rate, minus independent's precision.

Example::

    python -m benchmarks.label_quality work_dirs/fn_cpu/ifnd/seed_0 work_dirs/fn_cpu/ifnd/seed_1 \\
        --out label_quality.json --table label_quality.md --plot label_quality.png
"""
from __future__ import annotations

import argparse
import copy
import glob
import math
import os
import os.path as osp
import re
import sys
import time
from typing import Sequence

if not __package__:  # started as `python benchmarks/NAME.py`: import the package from the repository
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch

from ifnd.clustering import ClusteringRound, ConstantAcceptance, clustering_round, plan_round, round_seed
from ifnd.engine.arguments import check_arguments
from ifnd.engine.features import extract_features
from ifnd.engine.input_errors import input_errors_as_messages
from ifnd.engine.run_paths import DUMP_MARK
from ifnd.evaluation.analysis import (analysis_dataset, find_hook, load_feature_model, read_round,
                                      round_files)
from ifnd.evaluation.metrics import false_negative_rates, pair_precision_recall
from ifnd.fileio import AtomicLocalBackend
from ifnd.registry import HOOKS

from benchmarks.common import HelpFormatter, describe_device, report_results, resolve_device
from benchmarks.label_quality_report import markdown_table, number, plot, summarise

# The two ways of clustering the levels compared, in the tables' order.
HIERARCHIES = ('independent', 'nested')
ROUND_FILE = re.compile(r'^epoch_(\d+)\.npz$')


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Pair precision and recall of IFND\'s accepted pseudo labels, levels clustered '
        'independently (IFND\'s) against nested (HCSC\'s), on the features of each clustering '
        'round\'s checkpoint; prints a Markdown table.', formatter_class=HelpFormatter)
    parser.add_argument('work_dirs', nargs='+', metavar='WORK_DIR',
                        help='IFND runs\' work dirs (checkpoints epoch_N.pth beside the rounds\' '
                        'pseudo_labels/epoch_000N.npz), e.g. one per seed')
    parser.add_argument('--config', default=None,
                        help='the runs\' training config (default: the resolved config each run '
                        'dumped in its work dir)')
    parser.add_argument('--epochs', type=int, nargs='+', default=None,
                        help='measure the rounds after these epochs only (default: every round '
                        'with a checkpoint of its epoch)')
    parser.add_argument('--rate-step', type=float, default=0.02,
                        help='acceptance rates of the precision-recall curves: this step up to 1')
    parser.add_argument('--device', default='auto',
                        help="'auto' (CUDA when available), 'cpu' or 'cuda': the model, features "
                        'and k-means')
    parser.add_argument('--num-workers', type=int, default=None,
                        help='loader workers of the feature extraction (default: the run\'s '
                        'PseudoLabelHook\'s)')
    parser.add_argument('--threads', type=int, default=None,
                        help='CPU threads for torch and faiss (default: their own)')
    parser.add_argument('--out', default=None, help='also write the results as JSON here')
    parser.add_argument('--table', default=None, help='also write the Markdown tables here')
    parser.add_argument('--plot', default=None,
                        help='draw the precision-recall curves here (PNG, one panel per k)')
    args = parser.parse_args(argv)
    if not (0.0 < args.rate_step <= 1.0):
        parser.error(f'--rate-step must be in (0, 1], got {args.rate_step}')
    if args.threads is not None and args.threads < 1:
        parser.error(f'--threads must be at least 1, got {args.threads}')
    if args.epochs is not None and min(args.epochs) < 1:
        parser.error(f'--epochs must name epochs after training began (>= 1: a round after epoch 0 '
                     f'has no checkpoint), got {min(args.epochs)}')
    for path in args.work_dirs:
        if not osp.isdir(path):
            parser.error(f'WORK_DIR {path} is not a folder; pass an IFND run\'s work dir')
    check_arguments(inputs={'--config': args.config},
                    outputs={'--out': args.out, '--table': args.table, '--plot': args.plot},
                    num_workers=args.num_workers)
    return args


def sweep_rates(step: float) -> list[float]:
    """The acceptance rates of the curves: ``step, 2 step, ...``, up to and with 1."""
    rates = [round(step * i, 6) for i in range(1, int(math.floor(1.0 / step + 1e-9)) + 1)]
    return rates if rates[-1] == 1.0 else rates + [1.0]


def config_dump(work_dir: str) -> str:
    """The resolved config a training run dumped in ``work_dir``."""
    dumps = []
    for path in sorted(glob.glob(osp.join(work_dir, '*.py'))):
        with open(path, 'rb') as f:
            if f.read(len(DUMP_MARK)) == DUMP_MARK.encode():
                dumps.append(path)
    if len(dumps) != 1:
        found = f'{len(dumps)} ({", ".join(map(osp.basename, dumps))})' if dumps else 'none'
        raise FileNotFoundError(f'{work_dir}: expected one config dumped by its training run (a .py '
                                f'file starting "{DUMP_MARK}"), found {found}; pass the run\'s config '
                                'with --config')
    return dumps[0]


def round_checkpoints(work_dir: str, epochs: Sequence[int] | None) -> list[tuple[int, str, str]]:
    """``(epoch, round file, checkpoint)`` of the run's rounds that have a checkpoint of their epoch."""
    found = {}
    for path in round_files(work_dir):
        epoch = int(ROUND_FILE.match(osp.basename(path)).group(1))
        checkpoint = osp.join(work_dir, f'epoch_{epoch}.pth')
        if osp.isfile(checkpoint) and (epochs is None or epoch in epochs):
            found[epoch] = (epoch, path, checkpoint)
    missing = sorted(set(epochs or []) - set(found))
    if missing or not found:
        which = f'after epoch {", ".join(map(str, missing))}' if missing else 'at all'
        raise FileNotFoundError(f'{work_dir}: no clustering round with a checkpoint of its epoch '
                                f'(pseudo_labels/epoch_000N.npz beside epoch_N.pth) {which}; keep a '
                                'checkpoint at every round (default_hooks.checkpoint.interval = the '
                                'PseudoLabelHook\'s interval) or pick --epochs among the rounds kept')
    return [found[epoch] for epoch in sorted(found)]


def round_hook(cfg, source: str):
    """The run's PseudoLabelHook, built from its config (its settings checked as the run's were)."""
    settings = find_hook(cfg, 'PseudoLabelHook')
    if settings is None:
        raise ValueError(f'{source} has no PseudoLabelHook in custom_hooks: not a run with '
                         'clustering rounds; pass an IFND run\'s work dir')
    return HOOKS.build(settings)


def level_quality(result: ClusteringRound, level: int, truth: np.ndarray,
                  rates: Sequence[float]) -> dict:
    """Pair precision, recall, MTPR / MTNR (%) of one level's accepted labels, and its curve over
    ``rates`` (the round's scores cut at each rate)."""
    accepted = result.labels[level].numpy()
    precision, recall = pair_precision_recall(accepted, truth)
    mtpr, mtnr = false_negative_rates(accepted, truth)
    k = result.stats['levels'][level]['k']
    curve = {'rate': list(rates), 'precision': [], 'recall': []}
    for rate in rates:
        sweep = ConstantAcceptance(final_rate=rate)
        sweep.set_epoch(0, 1)
        labels, _ = sweep.accept(level, result.assignments[level], result.scores[level], k)
        p, r = pair_precision_recall(labels.numpy(), truth)
        curve['precision'].append(p)
        curve['recall'].append(r)
    return {'accepted': float((accepted >= 0).mean()), 'precision': precision, 'recall': recall,
            'mtpr': mtpr, 'mtnr': mtnr, 'curve': curve}


def precision_at_recall(curve: dict, recall: float) -> float:
    """A curve's precision at ``recall``, linear between its points; NaN outside its recalls."""
    r, p = np.asarray(curve['recall'], float), np.asarray(curve['precision'], float)
    keep = np.isfinite(r) & np.isfinite(p)
    r, p = r[keep], p[keep]
    if not math.isfinite(recall) or len(r) == 0 or not r.min() <= recall <= r.max():
        return math.nan
    order = np.argsort(r, kind='stable')  # recall grows with the rate: the curve's order
    return float(np.interp(recall, r[order], p[order]))


def compare_level(k: int, independent: dict, nested: dict) -> dict:
    """One level's two hierarchies compared at matched recall.

    ``difference``: nested's precision at independent's recall (the round's rate) minus
    independent's precision, NaN where nested's curve stops short of that recall;
    ``difference_at_lower_recall``: both curves at the lower of the two recalls at the round's rate,
    which both reach.
    """
    matched = precision_at_recall(nested['curve'], independent['recall'])
    lower = min(independent['recall'], nested['recall'])
    return {'k': k, 'independent': independent, 'nested': nested,
            'nested_precision_at_matched_recall': matched,
            'difference': matched - independent['precision'],
            'lower_recall': lower,
            'difference_at_lower_recall': precision_at_recall(nested['curve'], lower)
            - precision_at_recall(independent['curve'], lower)}


class Run:
    """One IFND run: its files, and the settings of its clustering rounds read from its config."""

    def __init__(self, work_dir: str, args: argparse.Namespace) -> None:
        self.work_dir = work_dir
        self.name = osp.basename(osp.normpath(work_dir))
        self.rounds = round_checkpoints(work_dir, args.epochs)
        self.config = args.config or config_dump(work_dir)
        # Read with the first checkpoint: the run's config, hook, training set, κ's τ, the levels of
        # each hierarchy and one acceptance per hierarchy.
        self.cfg = self.hook = self.dataset = self.temperature = None
        self.levels: dict[str, list[int]] = {}
        self.acceptance: dict = {}

    def load(self, checkpoint: str, device: torch.device) -> tuple[torch.nn.Module, str]:
        """The model of ``checkpoint`` on ``device`` and the feature its rounds clustered."""
        loaded = load_feature_model(checkpoint, None, self.config)
        if self.hook is None:
            self.cfg = loaded.cfg
            self.hook = round_hook(loaded.cfg, self.config)
            self.dataset = analysis_dataset(loaded.cfg)
            # τ of κ as the hook takes it: its own, else the model's loss temperature.
            self.temperature = float(loaded.model.temperature if self.hook.temperature is None
                                     else self.hook.temperature)
            self.levels = {'independent': list(self.hook.num_clusters),
                           'nested': sorted(set(self.hook.num_clusters), reverse=True)}
            # Each hierarchy's rounds go in order through a copy of its own: a scheme may keep the
            # last round (StableAcceptance).
            self.acceptance = {name: copy.deepcopy(self.hook.acceptance) for name in HIERARCHIES}
        return loaded.model.to(device), loaded.feature


def measure_round(run: Run, epoch: int, round_path: str, checkpoint: str,
                  args: argparse.Namespace, rates: Sequence[float], device: torch.device) -> dict:
    """Both hierarchies' labels of one round on the features of its checkpoint, per level."""
    model, feature = run.load(checkpoint, device)
    hook, saved = run.hook, read_round(round_path)
    tic = time.perf_counter()
    workers = hook.num_workers if args.num_workers is None else args.num_workers
    feats, truth = extract_features(model, run.dataset, feature, hook.batch_size, workers,
                                    desc=f'{run.name}: training set after epoch {epoch}',
                                    autocast=hook.autocast, source=checkpoint)
    seconds = {'extract': time.perf_counter() - tic}
    truth = truth.numpy()
    if not np.array_equal(truth, saved['true_labels']):
        raise ValueError(f'{round_path}: its samples\' classes differ from those of the training set '
                         f'{run.config} describes (another data set, subset or order); pass the run\'s '
                         'own config with --config')
    if saved['num_clusters'] != run.levels[hook.hierarchy]:
        raise ValueError(f"{round_path}: its levels (k = {saved['num_clusters']}) are not those of the "
                         f'PseudoLabelHook of {run.config} (num_clusters={run.levels[hook.hierarchy]}); '
                         "pass the run's own config with --config")
    if len(truth) and truth.min() < 0:
        raise ValueError(f'{run.config}: its training set has images without a class; pair '
                         'precision needs every class')
    backend, _ = plan_round(hook.kmeans['backend'], False, device, 1)
    results = {}
    for name in HIERARCHIES:
        acceptance = run.acceptance[name]
        acceptance.set_epoch(epoch, run.cfg.train_cfg.max_epochs)
        results[name] = clustering_round(
            feats.to(device), run.levels[name], acceptance=acceptance,
            temperature=run.temperature, seed=round_seed(hook.seed, epoch),
            kmeans={**hook.kmeans, 'backend': backend}, score=hook.score, hierarchy=name)
        seconds[f'kmeans_{name}'] = results[name].stats['seconds_kmeans']
    own = results[hook.hierarchy].labels.numpy()  # the run's own hierarchy and order of levels
    reproduced = [float(share) for share in (own == saved['labels']).mean(axis=1)]
    rate = run.acceptance['independent'].rate  # None where the round's evidence decides
    # The curves pass through the round's own rate: its operating point lies on them.
    curve_rates = sorted(set(rates) | ({round(rate, 6)} if rate else set()))
    levels = [compare_level(k, *(level_quality(results[name], run.levels[name].index(k), truth,
                                               curve_rates) for name in HIERARCHIES))
              for k in hook.num_clusters]
    return {'epoch': epoch, 'checkpoint': checkpoint, 'round_file': round_path,
            'rate': rate, 'seed': round_seed(hook.seed, epoch), 'kmeans_backend': backend,
            'reproduced': reproduced, 'seconds': seconds, 'levels': levels}


def _progress(index: int, total: int, run: Run, row: dict) -> None:
    levels = '; '.join(
        f"k={level['k']} independent {number(level['independent']['precision'])}/"
        f"{number(level['independent']['recall'])}, nested {number(level['nested']['precision'])}/"
        f"{number(level['nested']['recall'])}, Δ at matched recall {number(level['difference'], '+')}"
        for level in row['levels'])
    print(f"[{index}/{total}] {run.name} after epoch {row['epoch']}: features "
          f"{row['seconds']['extract']:.1f} s, the run's labels reproduced "
          f"{100 * min(row['reproduced']):.1f}%; precision/recall (%): {levels}",
          file=sys.stderr, flush=True)


def run_benchmark(args: argparse.Namespace) -> dict:
    """Every run's rounds measured, in order, and their summary."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        try:
            import faiss
            faiss.omp_set_num_threads(args.threads)
        except ImportError:  # k-means runs on the torch backend then
            pass
    device = resolve_device(args.device)
    rates = sweep_rates(args.rate_step)
    runs = [Run(path, args) for path in args.work_dirs]  # every run's files checked first
    total, done, out = sum(len(run.rounds) for run in runs), 0, []
    for run in runs:
        rows = []
        for epoch, round_path, checkpoint in run.rounds:
            rows.append(measure_round(run, epoch, round_path, checkpoint, args, rates, device))
            done += 1
            _progress(done, total, run, rows[-1])
        hook = run.hook
        out.append({'work_dir': run.work_dir, 'name': run.name, 'config': run.config,
                    'seed': run.cfg.get('randomness', {}).get('seed'), 'hierarchy': hook.hierarchy,
                    'num_clusters': run.levels['independent'], 'nested_clusters': run.levels['nested'],
                    'kmeans': dict(hook.kmeans), 'score': hook.score,
                    'temperature': run.temperature,
                    'acceptance': type(hook.acceptance).__name__, 'num_samples': len(run.dataset),
                    'feature': hook.feature, 'rounds': rows})
    settings = {key: value for key, value in vars(args).items() if key not in ('out', 'table', 'plot')}
    return {'benchmark': 'label_quality', 'device': describe_device(device), 'torch': torch.__version__,
            'settings': {**settings, 'rates': rates}, 'runs': out, 'summary': summarise(out)}


def main(argv: Sequence[str] | None = None) -> dict:
    """Measure every run's rounds, print the tables; optionally write JSON, tables and picture."""
    args = parse_args(argv)
    with input_errors_as_messages():
        result = run_benchmark(args)
        table = markdown_table(result)
        report_results(result, table, args.out, strict=True)
        if args.table:
            AtomicLocalBackend().put_text(table + '\n', args.table)
            print(f'Wrote {args.table}')
        if args.plot:
            plot(result, args.plot)
            print(f'Wrote {args.plot}')
    return result


if __name__ == '__main__':
    main(sys.argv[1:])
