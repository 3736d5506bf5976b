"""Reading a finished run: its logged scalars, IFND's clustering rounds, the flagged negatives."""
from __future__ import annotations

import argparse
import glob
import json
import math
import os.path as osp

import numpy as np

from ifnd.fileio.json_files import read_json
from ifnd.hooks.pseudo_label_hook import MAX_ROUNDS_BYTES

from .protocol import DETECTION_KEYS, METHODS


def read_scalars(work_dir: str, key: str, since: float | None) -> list[tuple[int, float]]:
    """``(step, value)`` of a scalar in the newest run's vis_data/scalars.json under ``work_dir``.

    Each run writes ``<work_dir>/<timestamp>/vis_data/scalars.json``, one JSON object per line.
    Runs older than ``since`` (a time stamp) are ignored, so stale results are never reported.
    """
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if since is not None:
        files = [f for f in files if osp.getmtime(f) >= since]
    for path in reversed(files):  # newest time stamp first
        history = []
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    record = json.loads(line)
                    if key in record:
                        history.append((int(record.get('step', -1)), float(record[key])))
        if history:
            return sorted(history)
    raise RuntimeError(f'no {key} scalar found under {work_dir}/*/vis_data/scalars.json'
                       + (' written by this run' if since is not None else ''))


def final_knn_top1(work_dir: str, since: float | None) -> tuple[float, int, list]:
    """Final ``knn/top1`` of the newest run in ``work_dir``, its epoch and the whole history."""
    history = read_scalars(work_dir, 'knn/top1', since)
    step, top1 = history[-1]
    return top1, step, history


def last_round(work_dir: str, since: float | None) -> tuple[dict, dict | None]:
    """Last clustering round of ``pseudo_labels/rounds.json``, and the last one used in training.

    The round after the final epoch is the last one written; its labels are not trained on any
    more, so the round before it is returned too (None when there is none).
    """
    path = osp.join(work_dir, 'pseudo_labels', 'rounds.json')
    if not osp.isfile(path):
        raise RuntimeError(f'{path} not found: did the IFND run cluster?')
    if since is not None and osp.getmtime(path) < since:
        raise RuntimeError(f'{path} predates this run')
    rounds = read_json(path, MAX_ROUNDS_BYTES, own=True)
    if not rounds:
        raise RuntimeError(f'{path} holds no round')
    rounds = sorted(rounds, key=lambda r: r['epoch'])
    return rounds[-1], (rounds[-2] if len(rounds) > 1 else None)


def pick_level(round_stats: dict, level: int | str) -> dict:
    """The statistics of one clustering level: the finest (largest k) or the given index."""
    levels = round_stats['levels']
    if level == 'finest':
        return max(levels, key=lambda lv: lv['k'])
    if not -len(levels) <= level < len(levels):
        raise SystemExit(f'--level {level} is out of range: the round has {len(levels)} levels')
    return levels[level]


def collect(plan: dict, record: dict, args: argparse.Namespace) -> dict:
    """Top-1 (kNN and linear) and label statistics of one finished run."""
    method, work_dir = plan['method'], plan['work_dir']
    top1, step, history = final_knn_top1(work_dir, None)
    entry = {'method': method, 'seed': plan['seed'], 'top1': top1, 'top1_epoch': step,
             'top1_history': history, 'seconds': record.get('seconds'),
             'linear_seconds': record.get('linear_seconds'), 'command': record['commands']}
    if plan['linear_cmd']:
        entry['linear_top1'] = read_scalars(osp.join(work_dir, 'linear'), 'top1',
                                            None)[-1][1]
    kind = METHODS[method]
    if kind.clusters:
        rounds = read_json(osp.join(work_dir, 'pseudo_labels', 'rounds.json'), MAX_ROUNDS_BYTES, own=True)
        entry['rounds'] = sorted(rounds, key=lambda r: r['epoch'])
        entry['detection'] = detection_over_training(entry['rounds'], step)
        level = pick_level(entry['rounds'][-1], args.level)
        entry.update(mtpr=level.get('mtpr', math.nan), mtnr=level.get('mtnr', math.nan),
                     k=level['k'])
    elif kind.known_rates is not None:
        entry.update(zip(('mtpr', 'mtnr'), kind.known_rates))
    if kind.flags:
        entry['flagged'] = flagged_negatives(work_dir)
    return entry


def flagged_negatives(work_dir: str) -> dict | None:
    """Per-epoch precision and recall (%) of flagged negatives and their means; None if unlogged."""
    try:
        result = {key: read_scalars(work_dir, key, None) for key in DETECTION_KEYS}
    except RuntimeError:
        return None
    result.update({f'{key}_mean': float(np.nanmean([v for _, v in values]))
                   for key, values in result.items()})
    return result


def detection_over_training(rounds: list[dict], epochs: int) -> dict:
    """Shares of false and true negatives IFND eliminated, averaged over epochs and levels.

    The loss averages its levels, and epoch e trains on the labels of the last round before it,
    so these are the shares of the oracle's eliminations made (MTPR) and of true negatives
    eliminated wrongly (100 - MTNR) in the loss terms of the whole run; the epochs before the
    first round (a warm-up) eliminate nothing.
    """
    ordered = sorted(rounds, key=lambda r: r['epoch'])
    mtpr, wrong = [], []
    for epoch in range(1, epochs + 1):
        earlier = [r for r in ordered if r['epoch'] < epoch]
        levels = earlier[-1]['levels'] if earlier else [{'mtpr': 0.0, 'mtnr': 100.0}]
        mtpr.append(np.mean([lv.get('mtpr', math.nan) for lv in levels]))
        wrong.append(np.mean([100.0 - lv.get('mtnr', math.nan) for lv in levels]))
    return {'false_negatives_eliminated': float(np.mean(mtpr)),
            'true_negatives_eliminated': float(np.mean(wrong))}
