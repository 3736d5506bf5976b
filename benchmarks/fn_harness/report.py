"""The results for people: Markdown tables with error bars, and a picture over epochs."""
from __future__ import annotations

import math
import os
import os.path as osp

import numpy as np

from .protocol import DETECTION_KEYS, METHODS, method_option_texts
from .stats import mean_sd


def _pm(stat: dict | None) -> str:
    if not stat:
        return '—'
    return f"{stat['mean']:.2f}" + ('' if math.isnan(stat['sd']) else f" ± {stat['sd']:.2f}")


def _ci(stat: dict | None, key: str = 'mean', scale: float = 1.0, fmt: str = '{:+.2f}') -> str:
    if not stat:
        return '—'
    value = fmt.format(stat[key] * scale)
    if math.isnan(stat['low']):
        return value
    ends = ['−∞' if v == -math.inf else '∞' if v == math.inf else fmt.format(v * scale)
            for v in (stat['low'], stat['high'])]
    return f'{value} [{ends[0]}, {ends[1]}]'


def _caption(result: dict) -> str:
    s = result['settings']
    seeds = s['seeds']
    stem = {None: '', True: ' (CIFAR stem)', False: ' (standard stem)'}[s['cifar_stem']]
    width = '' if not s.get('channels') else f", widths {','.join(map(str, s['channels']))}"
    budget = (f"{s['epochs'] or 'config'} epochs, subset {s['subset'] or 1}, batch "
              f"{s['batch_size'] or 'config'}, backbone {s['backbone'] or 'config'}{stem}{width}")
    split = ('held-out validation part of the training split' if s['eval_split'] == 'val'
             else 'test split')
    own = method_option_texts(s.get('method_options') or {})
    if own:
        budget += f"; the methods' own settings {', '.join(own)}"
    merged = ''.join(f"; {len(source['runs'])} of the {len(result['runs'])} runs read from "
                     f"{osp.basename(source['file'])}" for source in result.get('merged_from', []))
    return (f"False-negative methods on {s['dataset']} ({s['preset']} preset: {budget}), "
            f"{len(seeds)} seeds ({', '.join(map(str, seeds))}), trained on {result['device']}"
            f'{merged}; evaluated on the {split}. Top-1: mean ± sd over seeds; Δ: mean of the '
            'per-seed paired differences to SimCLR [95% t-interval]; gap closed: (method − '
            "SimCLR) / (SupCon − SimCLR) [Fieller's 95% interval]")


def _comparison_table(result: dict) -> list[str]:
    summary, runs, seeds = result['summary'], result['runs'], result['settings']['seeds']
    lines = ['| Method | Labels | kNN top-1 (%) | linear top-1 (%) | Δ kNN vs SimCLR '
             '| Δ linear vs SimCLR | gap closed, kNN | gap closed, linear | Train (s) |',
             '|---|---|---:|---:|---:|---:|---:|---:|---:|']
    for m in METHODS:
        stats = summary['methods'].get(m)
        if not stats:
            continue
        paired = summary['paired'].get(m, {})
        gap = summary['gap_closed'].get(m, {})
        secs = [r['seconds'] for r in runs if r['method'] == m and r.get('seconds')]
        have = len(stats['top1']['values']) if 'top1' in stats else len(seeds)
        title = METHODS[m].title + (f' ({have} of {len(seeds)} seeds)' if have < len(seeds) else '')
        lines.append(
            f"| {title} | {METHODS[m].labels} | {_pm(stats.get('top1'))} | "
            f"{_pm(stats.get('linear_top1'))} | {_ci(paired.get('top1'))} | "
            f"{_ci(paired.get('linear_top1'))} | "
            f"{_ci(gap.get('top1'), 'share', 100, '{:.0f}%')} | "
            f"{_ci(gap.get('linear_top1'), 'share', 100, '{:.0f}%')} | "
            + (f"{np.mean(secs):.0f} |" if secs else '— |'))
    return lines


def _contrasts_table(result: dict) -> list[str]:
    contrasts = result['summary'].get('contrasts') or {}
    if not contrasts:
        return []
    lines = ['', 'Paired contrasts (method − method on the seeds both ran, percentage points, '
             'mean [95% t-interval]):', '', '| Contrast | kNN top-1 | linear top-1 |', '|---|---:|---:|']
    for pair, stats in contrasts.items():
        a, b = pair.split(' - ')
        lines.append(f"| {METHODS[a].title} − {METHODS[b].title} | {_ci(stats.get('top1'))} | "
                     f"{_ci(stats.get('linear_top1'))} |")
    return lines


def _per_seed_table(result: dict) -> list[str]:
    summary, runs, seeds = result['summary'], result['runs'], result['settings']['seeds']
    present = [m for m in METHODS if m in summary['methods']]
    lines = ['', 'Per seed (kNN / linear top-1, %):', '',
             '| Seed | ' + ' | '.join(METHODS[m].title for m in present) + ' |',
             '|---:|' + '---:|' * len(present)]
    by = {(r['method'], r['seed']): r for r in runs}
    for seed in seeds:
        cells = []
        for m in present:
            r = by.get((m, seed))
            if r is None:  # not finished (--skip-train)
                cells.append('—')
                continue
            lin = r.get('linear_top1')
            cells.append(f"{r['top1']:.2f}" + ('' if lin is None else f' / {lin:.2f}'))
        lines.append(f'| {seed} | ' + ' | '.join(cells) + ' |')
    return lines


def _flagged_table(runs: list[dict]) -> list[str]:
    flagged = [(m, [r['flagged'] for r in runs if r['method'] == m and r.get('flagged')])
               for m, method in METHODS.items() if method.flags]
    flagged = [(m, fl) for m, fl in flagged if fl]
    if not flagged:
        return []
    lines = ['', 'Negatives flagged as false in the batches trained on, against the '
             'ground-truth classes (%): precision (flagged that share the anchor\'s class) '
             'and recall (same-class negatives flagged), the mean over epochs and the last '
             'epoch, mean ± sd over seeds. SupCon and the oracle flag with precision and '
             'recall 100, SimCLR flags nothing.', '',
             '| Method | precision | recall | precision, last epoch | recall, last epoch |',
             '|---|---:|---:|---:|---:|']
    for m, fl in flagged:
        cells = [_pm(dict(zip(('mean', 'sd'), mean_sd([f[f'{key}_mean'] for f in fl]))))
                 for key in DETECTION_KEYS]
        cells += [_pm(dict(zip(('mean', 'sd'), mean_sd([f[key][-1][1] for f in fl]))))
                  for key in DETECTION_KEYS]
        runs_of = sum(r['method'] == m for r in runs)
        # Runs trained before the detection scalars were logged are left out, and said so.
        title = METHODS[m].title + (f' ({len(fl)} of {runs_of} seeds)' if len(fl) < runs_of else '')
        lines.append(f'| {title} | ' + ' | '.join(cells) + ' |')
    return lines


def _level_mean(rounds: list[dict], level: int, key: str) -> float:
    """One level's ``key`` averaged over the seeds' same round (NaN where missing or null)."""
    values = [rd['levels'][level].get(key) for rd in rounds]
    return float(np.mean([math.nan if v is None else v for v in values]))


def _rounds_table(runs: list[dict]) -> list[str]:
    ifnd = [r for r in runs if r['method'] == 'ifnd']
    if not ifnd:
        return []
    ks = [lv['k'] for lv in ifnd[0]['rounds'][0]['levels']]
    lines = ['', 'IFND pseudo labels per clustering round (mean over seeds): acceptance '
             'rate, then MTPR / MTNR (%) of the labels used, per k. A round after epoch e '
             'gives the labels of epochs e+1 onwards.', '',
             '| after epoch | rate | ' + ' | '.join(f'k={k}' for k in ks) + ' |',
             '|---:|---:|' + '---:|' * len(ks)]
    for i, first in enumerate(ifnd[0]['rounds']):
        rounds = [r['rounds'][i] for r in ifnd if i < len(r['rounds'])]
        cells = []
        for j in range(len(ks)):
            mtpr, mtnr = _level_mean(rounds, j, 'mtpr'), _level_mean(rounds, j, 'mtnr')
            cells.append(f'{mtpr:.1f} / {mtnr:.2f}')
        lines.append(f"| {first['epoch']} | {first['rate']:.2f} | " + ' | '.join(cells) + ' |')
    fn = mean_sd([r['detection']['false_negatives_eliminated'] for r in ifnd])
    tn = mean_sd([r['detection']['true_negatives_eliminated'] for r in ifnd])
    lines += ['', f'Over the whole run (every epoch with the labels it trained on, averaged '
              f'over the levels as the loss is), IFND eliminated {fn[0]:.1f}% of the false '
              f'negatives (the oracle: 100%) and {tn[0]:.2f}% of the true negatives '
              '(the oracle: 0%).']
    return lines


def _acceptance_table(runs: list[dict]) -> list[str]:
    """Per clustering method, round and k: the share of labels accepted and the pair precision /
    recall of the flags they make (runs whose rounds.json carries them)."""
    lines = []
    for method in (m for m, record in METHODS.items() if record.clusters):
        lines += _acceptance_rows(method, [r for r in runs if r['method'] == method and r.get('rounds')
                                           and 'flag_precision' in r['rounds'][-1]['levels'][0]])
    return lines


def _acceptance_rows(method: str, ifnd: list[dict]) -> list[str]:
    if not ifnd:
        return []
    ks = [lv['k'] for lv in ifnd[0]['rounds'][0]['levels']]
    lines = ['', f'{METHODS[method].title} acceptance per clustering round (mean over seeds), per k: '
             'accepted share, then the precision / recall (%) of the pairs its labels flag '
             '(recall counts every same-class pair of the training set).', '',
             '| after epoch | ' + ' | '.join(f'k={k}' for k in ks) + ' |', '|---:|' + '---:|' * len(ks)]
    for i, first in enumerate(ifnd[0]['rounds']):
        rounds = [r['rounds'][i] for r in ifnd if i < len(r['rounds'])]
        cells = []
        for j in range(len(ks)):
            precision = _level_mean(rounds, j, 'flag_precision')
            shown = '—' if math.isnan(precision) else f'{precision:.1f}'  # nothing flagged
            cells.append(f"{100 * _level_mean(rounds, j, 'accept_rate'):.1f}% · {shown} / "
                         f"{_level_mean(rounds, j, 'flag_recall'):.1f}")
        lines.append(f"| {first['epoch']} | " + ' | '.join(cells) + ' |')
    return lines


def markdown_tables(result: dict) -> str:
    """The comparison table with error bars, per-seed numbers, flagged negatives, IFND's rounds."""
    lines = [_caption(result), '', *_comparison_table(result), *_contrasts_table(result),
             *_per_seed_table(result),
             *_flagged_table(result['runs']), *_rounds_table(result['runs']),
             *_acceptance_table(result['runs'])]
    return '\n'.join(lines)


def _method_colours() -> dict:
    """One colour per method, the same in every panel: tab20's dark shades, then its light ones."""
    import matplotlib
    cmap = matplotlib.colormaps['tab20']
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return {m: cmap(order[i % 20]) for i, m in enumerate(METHODS)}


def _plot_top1(ax, result: dict, colours: dict) -> None:
    for m in METHODS:
        histories = [dict(r['top1_history']) for r in result['runs'] if r['method'] == m]
        if not histories:
            continue
        epochs = sorted(set.intersection(*(set(h) for h in histories)))
        values = np.array([[h[e] for e in epochs] for h in histories])
        mean, sd = values.mean(0), values.std(0, ddof=1) if len(values) > 1 else 0 * values[0]
        ax.plot(epochs, mean, marker='o', ms=3, color=colours[m], label=METHODS[m].title)
        ax.fill_between(epochs, mean - sd, mean + sd, color=colours[m], alpha=0.2)
    ax.set(xlabel='epoch', ylabel='kNN top-1 (%)',
           title=f"kNN top-1, mean ± sd over {len(result['settings']['seeds'])} seed(s)")
    ax.grid(alpha=0.3)


def _plot_rounds(axes, ifnd: list[dict]) -> None:
    ks = [lv['k'] for lv in ifnd[0]['rounds'][0]['levels']]
    epochs = [rd['epoch'] for rd in ifnd[0]['rounds']]
    for ax, key, label in ((axes[0], 'mtpr', 'MTPR (%)'), (axes[1], 'mtnr', 'MTNR (%)')):
        for j, k in enumerate(ks):
            values = np.array([[rd['levels'][j].get(key, math.nan) for rd in r['rounds']]
                               for r in ifnd])
            ax.plot(epochs, values.mean(0), marker='o', ms=3, label=f'k={k}')
        ax.set(xlabel='clustering round (after epoch)', ylabel=label,
               title=f'IFND pseudo labels: {label[:4]}')
        ax.grid(alpha=0.3)
        rate = ax.twinx()
        rate.plot(epochs, [rd['rate'] for rd in ifnd[0]['rounds']], 'k--', lw=1,
                  label='acceptance rate')
        rate.set_ylabel('acceptance rate')
        rate.set_ylim(0, 1.05)
        handles = ax.get_legend_handles_labels()
        extra = rate.get_legend_handles_labels()
        ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=8)


def _plot_flagged(ax, runs: list[dict], flaggers: list[str], colours: dict) -> None:
    for m in flaggers:  # precision solid, recall dashed
        for key, style in zip(DETECTION_KEYS, ('-', '--')):
            histories = [dict(r['flagged'][key]) for r in runs
                         if r['method'] == m and r.get('flagged')]
            epochs = sorted(set.intersection(*(set(h) for h in histories)))
            values = np.array([[h[e] for e in epochs] for h in histories])
            ax.plot(epochs, np.nanmean(values, 0), style, marker='o', ms=3, color=colours[m])
    ax.set(xlabel='epoch', ylabel='%', ylim=(0, 102),
           title='negatives flagged as false: precision, recall')
    ax.grid(alpha=0.3)
    ax.plot([], [], 'k-', label='precision')  # the line styles' key; colours: the figure's legend
    ax.plot([], [], 'k--', label='recall')
    ax.legend(fontsize=8)


def plot(result: dict, path: str) -> None:
    """kNN top-1 per method, IFND's rounds and the flagged negatives' precision and recall."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    runs = result['runs']
    ifnd = [r for r in runs if r['method'] == 'ifnd']
    flaggers = [m for m, method in METHODS.items()
                if method.flags and any(r['method'] == m and r.get('flagged') for r in runs)]
    panels = 1 + 2 * bool(ifnd) + bool(flaggers)
    shown = [m for m in METHODS if any(r['method'] == m for r in runs)]
    columns = min(len(shown), 2 * panels)
    legend_rows = -(-len(shown) // columns)
    # The methods' colours in one legend under the panels, however many methods ran.
    legend_height = 0.22 * legend_rows + 0.2
    height = 4.2 + legend_height
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, height), squeeze=False)
    colours = _method_colours()
    fig.legend([plt.Line2D([], [], color=colours[m], marker='o', ms=3) for m in shown],
               [METHODS[m].title for m in shown], loc='lower center', ncol=columns, fontsize=8,
               frameon=False)
    _plot_top1(axes[0, 0], result, colours)
    if ifnd:
        _plot_rounds(axes[0, 1:3], ifnd)
    if flaggers:
        _plot_flagged(axes[0, panels - 1], runs, flaggers, colours)
    fig.tight_layout(rect=(0, legend_height / height, 1, 1))
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f'Wrote {path}')
