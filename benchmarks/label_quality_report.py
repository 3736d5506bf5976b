"""The label-quality results for people: the summary over rounds and runs, the Markdown tables
and the precision-recall picture of ``benchmarks/label_quality.py``."""
from __future__ import annotations

import math
import os
import os.path as osp
import warnings
from typing import Sequence

import numpy as np

from benchmarks.fn_harness.stats import mean_sd, t_interval

# Per level and round, the values the tables summarise (percent), by name.
MEASURES = {
    'independent_precision': lambda level: level['independent']['precision'],
    'independent_recall': lambda level: level['independent']['recall'],
    'nested_precision': lambda level: level['nested']['precision'],
    'nested_recall': lambda level: level['nested']['recall'],
    'nested_precision_at_matched_recall': lambda level: level['nested_precision_at_matched_recall'],
    'difference': lambda level: level['difference'],
    'difference_at_lower_recall': lambda level: level['difference_at_lower_recall'],
}
DIFFERENCES = ('difference', 'difference_at_lower_recall')


def number(value: float, sign: str = '') -> str:
    """A percentage to one decimal, — where undefined."""
    return f'{value:{sign}.1f}' if math.isfinite(value) else '—'


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _stat(values: Sequence[float]) -> dict:
    """Mean, sd and 95% t-interval of the finite values, with their count."""
    values = _finite(values)
    if not values:
        return {'mean': math.nan, 'sd': math.nan, 'low': math.nan, 'high': math.nan, 'n': 0}
    mean, sd = mean_sd(values)
    _, low, high = t_interval(values)
    return {'mean': mean, 'sd': sd, 'low': low, 'high': high, 'n': len(values)}


def summarise(runs: list[dict]) -> dict:
    """Per k: each run's mean over its rounds, then mean ± sd over runs (``levels``); per round and
    k: mean ± sd over runs (``rounds``)."""
    ks = sorted({level['k'] for run in runs for row in run['rounds'] for level in row['levels']})
    by_k = {}
    for k in ks:
        levels = [[level for row in run['rounds'] for level in row['levels'] if level['k'] == k]
                  for run in runs]
        stats = {}
        for name, read in MEASURES.items():
            means = [_finite(read(level) for level in own) for own in levels]
            stats[name] = _stat([float(np.mean(values)) if values else math.nan for values in means])
        # Over every round of every run: in how many nested was the more precise at matched recall.
        for name in DIFFERENCES:
            values = _finite(MEASURES[name](level) for own in levels for level in own)
            stats[name].update(rounds=len(values), nested_higher=sum(v > 0 for v in values))
        by_k[k] = stats
    epochs = sorted({row['epoch'] for run in runs for row in run['rounds']})
    rounds = []
    for epoch in epochs:
        rows = [row for run in runs for row in run['rounds'] if row['epoch'] == epoch]
        for k in ks:
            levels = [level for row in rows for level in row['levels'] if level['k'] == k]
            rounds.append({'epoch': epoch, 'k': k, 'rate': _stat([row['rate'] for row in rows]),
                           **{name: _stat([read(level) for level in levels])
                              for name, read in MEASURES.items()}})
    return {'levels': [{'k': k, **by_k[k]} for k in ks], 'rounds': rounds}


def _pm(stat: dict, sign: str = '') -> str:
    if not stat['n']:
        return '—'
    return number(stat['mean'], sign) + ('' if math.isnan(stat['sd']) else f" ± {stat['sd']:.1f}")


def _pair(precision: dict, recall: dict) -> str:
    return f'{_pm(precision)} / {_pm(recall)}'


def _difference(stat: dict) -> str:
    interval = '' if math.isnan(stat['low']) else f" [{stat['low']:+.1f}, {stat['high']:+.1f}]"
    return _pm(stat, '+') + interval


def markdown_table(result: dict) -> str:
    """The summary per k and the per-round table, with a line saying what was measured."""
    runs, summary = result['runs'], result['summary']
    seeds = ', '.join(str(run['seed']) for run in runs)
    epochs = sorted({row['epoch'] for run in runs for row in run['rounds']})
    reproduced = [share for run in runs for row in run['rounds'] for share in row['reproduced']]
    rates = result['settings']['rates']
    first = runs[0]
    lines = [
        f"Pseudo labels of {len(runs)} IFND run(s) (seeds {seeds}; {first['num_samples']} training "
        f"images, '{first['feature']}' features, κ at τ = {first['temperature']:g}, "
        f"{first['acceptance']}) on {result['device']}: the rounds after epochs "
        f"{', '.join(map(str, epochs))}, each on its checkpoint's features, clustered with the "
        f"round's seed and k-means options, levels independent (k = "
        f"{', '.join(map(str, first['num_clusters']))}) and nested (k = "
        f"{', '.join(map(str, first['nested_clusters']))}). The runs' own hierarchy "
        f"({', '.join(sorted({run['hierarchy'] for run in runs}))}) gave {100 * min(reproduced):.2f}% "
        'or more of their labels back (the least over rounds and levels).',
        '',
        "Pair precision / recall (%) of the labels accepted at each round's rate. Nested precision "
        "at independent's recall: nested's precision-recall curve (acceptance rates "
        f"{rates[0]:g}, {rates[1] if len(rates) > 1 else 1:g}, ..., 1 and the round's) interpolated "
        "at independent's recall; Δ: that minus independent's precision (points), — where nested's "
        'curve stops short of that recall; Δ at the lower recall: both curves at the lower of the '
        "two recalls at the round's rate. Each run's mean over its rounds, then mean ± sd over runs, "
        'the Δs with their 95% t-interval over runs and the rounds (of all runs) where nested was '
        'the more precise:',
        '',
        "| k | independent: precision / recall | nested, same rate: precision / recall | nested "
        "precision at independent's recall | Δ at matched recall | nested higher | Δ at the lower "
        'recall | nested higher |',
        '|---:|---:|---:|---:|---:|---:|---:|---:|',
    ]
    for level in summary['levels']:
        lines.append(
            f"| {level['k']} | {_pair(level['independent_precision'], level['independent_recall'])} | "
            f"{_pair(level['nested_precision'], level['nested_recall'])} | "
            f"{_pm(level['nested_precision_at_matched_recall'])} | "
            + ' | '.join(f"{_difference(level[name])} | {level[name]['nested_higher']} of "
                         f"{level[name]['rounds']}" for name in DIFFERENCES) + ' |')
    lines += ['', 'Per round (mean ± sd over runs):', '',
              "| after epoch | rate | k | independent: precision / recall | nested, same rate: "
              "precision / recall | nested precision at independent's recall | Δ at matched recall | "
              'Δ at the lower recall |',
              '|---:|---:|---:|---:|---:|---:|---:|---:|']
    for row in summary['rounds']:
        rate = '—' if not row['rate']['n'] else f"{row['rate']['mean']:.2f}"
        lines.append(
            f"| {row['epoch']} | {rate} | {row['k']} | "
            f"{_pair(row['independent_precision'], row['independent_recall'])} | "
            f"{_pair(row['nested_precision'], row['nested_recall'])} | "
            f"{_pm(row['nested_precision_at_matched_recall'])} | {_pm(row['difference'], '+')} | "
            f"{_pm(row['difference_at_lower_recall'], '+')} |")
    return '\n'.join(lines)


def _mean_curve(runs: list[dict], epoch: int, k: int, hierarchy: str) -> tuple[np.ndarray, np.ndarray]:
    """Recall and precision at each rate of a round's curves, each the mean over the runs."""
    by_rate: dict[float, list[tuple[float, float]]] = {}
    for run in runs:
        for row in run['rounds']:
            for level in row['levels']:
                if row['epoch'] == epoch and level['k'] == k:
                    curve = level[hierarchy]['curve']
                    for rate, r, p in zip(curve['rate'], curve['recall'], curve['precision']):
                        by_rate.setdefault(rate, []).append((r, p))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # the mean of none: no run flags a pair there
        points = np.array([np.nanmean(by_rate[rate], axis=0) for rate in sorted(by_rate)])
    return points[:, 0], points[:, 1]


def plot(result: dict, path: str) -> None:
    """One panel per k: precision against recall over the swept rates, independent (solid) and
    nested (dashed), one colour per round, the rounds' own rates marked; means over runs."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    runs = result['runs']
    ks = [level['k'] for level in result['summary']['levels']]
    epochs = sorted({row['epoch'] for run in runs for row in run['rounds']})
    colours = matplotlib.colormaps['viridis'](np.linspace(0.0, 0.9, len(epochs)))
    fig, axes = plt.subplots(1, len(ks), figsize=(4.6 * len(ks) + 1.2, 4.4), squeeze=False)
    styles = {'independent': ('-', 'o'), 'nested': ('--', '^')}
    for ax, k in zip(axes[0], ks):
        for colour, epoch in zip(colours, epochs):
            rounds = [row for row in result['summary']['rounds'] if row['epoch'] == epoch and row['k'] == k]
            for name, (line, marker) in styles.items():
                recall, precision = _mean_curve(runs, epoch, k, name)
                ax.plot(recall, precision, line, color=colour, lw=1.2, alpha=0.85)
                if rounds:
                    point = rounds[0]
                    ax.plot(point[f'{name}_recall']['mean'], point[f'{name}_precision']['mean'], marker,
                            color=colour, ms=6, mec='black', mew=0.6)
        ax.set_title(f'k = {k}')
        ax.set_xlabel('pair recall (%)')
        ax.set_ylim(0, 100)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('pair precision (%)')
    handles = [Line2D([], [], color='grey', ls=line, marker=marker, mec='black', label=name)
               for name, (line, marker) in styles.items()]
    handles += [Line2D([], [], color=colour, lw=3, label=f'after epoch {epoch}')
                for colour, epoch in zip(colours, epochs)]
    fig.legend(handles=handles, loc='center right', fontsize=8, frameon=False)
    seeds = ', '.join(str(run['seed']) for run in runs)
    fig.suptitle(f'Accepted pseudo labels over acceptance rates {result["settings"]["rates"][0]:g}-1, '
                 f'mean over {len(runs)} run(s) (seeds {seeds}); markers: the rounds\' own rates',
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.3 / fig.get_figwidth(), 0.95))
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
