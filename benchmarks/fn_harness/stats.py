"""Statistics over seeds: mean and sd, paired t-intervals, Fieller's interval for a ratio."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .protocol import CONTRASTS, GAP, METHODS


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences and its two-sided Student-t interval."""
    from scipy import stats
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def fieller_interval(num: Sequence[float], den: Sequence[float],
                     level: float = 0.95) -> tuple[float, float, float]:
    """Ratio of paired means mean(num) / mean(den) and Fieller's interval for it.

    The interval is every rho with |mean(num - rho den)| <= t * se(num - rho den); it is
    (-inf, inf) when the denominator's mean is not clearly away from zero.
    """
    from scipy import stats
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = len(num)
    ratio = float(num.mean() / den.mean()) if den.mean() != 0 else math.nan
    if n < 2:
        return ratio, math.nan, math.nan
    t2 = stats.t.ppf(0.5 + level / 2, n - 1) ** 2
    cov = np.cov(num, den, ddof=1) / n
    a = den.mean() ** 2 - t2 * cov[1, 1]
    b = -2 * (num.mean() * den.mean() - t2 * cov[0, 1])
    c = num.mean() ** 2 - t2 * cov[0, 0]
    disc = b * b - 4 * a * c
    if a <= 0 or disc < 0:
        return ratio, -math.inf, math.inf
    root = math.sqrt(disc)
    return ratio, (-b - root) / (2 * a), (-b + root) / (2 * a)


def summarise(runs: list[dict], seeds: Sequence[int]) -> dict:
    """Per-method mean +- sd, paired differences to SimCLR and the share of the gap closed.

    A method missing some seeds (read with --skip-train before they finished) is summarised over
    the seeds it has, and compared with SimCLR and SupCon on the seeds they share.
    """
    by = {(r['method'], r['seed']): r for r in runs}
    methods = [m for m in METHODS if any(r['method'] == m for r in runs)]
    summary: dict = {'methods': {}, 'paired': {}, 'gap_closed': {}, 'contrasts': {}}

    def values(method: str, metric: str) -> dict:
        return {s: by[method, s][metric] for s in seeds
                if (method, s) in by and metric in by[method, s]}

    for metric in ('top1', 'linear_top1'):
        for m in methods:
            got = values(m, metric)
            if got:
                mean, sd = mean_sd(list(got.values()))
                summary['methods'].setdefault(m, {})[metric] = {
                    'mean': mean, 'sd': sd, 'values': list(got.values()), 'seeds': list(got)}
        base, top = (values(end, metric) for end in GAP)
        for m in methods:
            if m == GAP[0] or not base:
                continue
            got = values(m, metric)
            shared = [s for s in got if s in base]
            diffs = [got[s] - base[s] for s in shared]
            if diffs:
                mean, lo, hi = t_interval(diffs)
                summary['paired'].setdefault(m, {})[metric] = {
                    'mean': mean, 'low': lo, 'high': hi, 'values': diffs, 'seeds': shared}
            shared = [s for s in shared if s in top]
            if m not in GAP and shared:
                share, lo, hi = fieller_interval([got[s] - base[s] for s in shared],
                                                 [top[s] - base[s] for s in shared])
                summary['gap_closed'].setdefault(m, {})[metric] = {
                    'share': share, 'low': lo, 'high': hi, 'seeds': shared}
        for a, b in CONTRASTS:
            first, second = values(a, metric), values(b, metric)
            shared = [s for s in first if s in second]
            if len(shared) > 1:
                mean, lo, hi = t_interval([first[s] - second[s] for s in shared])
                summary['contrasts'].setdefault(f'{a} - {b}', {})[metric] = {
                    'mean': mean, 'low': lo, 'high': hi, 'seeds': shared}
    return summary
