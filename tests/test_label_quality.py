"""benchmarks/label_quality.py end to end on a short IFND run on digits: the run's own labels
recomputed from its checkpoints, both hierarchies' precision and recall, the outputs' structure."""
import json
import math

import numpy as np
import pytest
from helpers import digits_config

from benchmarks import label_quality
from ifnd.evaluation.analysis import read_round
from ifnd.registry import RUNNERS

KS = [3, 8]


@pytest.fixture(scope='module')
def ifnd_run(tmp_path_factory):
    """Two epochs of IFND on a tenth of digits, a clustering round and a checkpoint every epoch."""
    work_dir = tmp_path_factory.mktemp('label_quality') / 'run'
    hook = dict(num_clusters=KS, interval=1, seed=3, kmeans=dict(niter=5, nredo=1))
    cfg = digits_config(str(work_dir), dict(type='IFND', temperature=0.5), max_epochs=2,
                        pseudo_labels=hook, batch_size=32, randomness=dict(seed=4))
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    RUNNERS.build(cfg).train()
    return work_dir


def brute_force_pairs(labels: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """Pair precision and recall (%) with an N x N loop: pairs i != j of one label, of one class."""
    same_label = labels[:, None] == labels[None, :]
    same_class = truth[:, None] == truth[None, :]
    np.fill_diagonal(same_label, False)
    np.fill_diagonal(same_class, False)
    correct = (same_label & same_class).sum()
    return 100 * correct / same_label.sum(), 100 * correct / same_class.sum()


def test_label_quality_end_to_end(ifnd_run, tmp_path, capsys):
    out, table, picture = tmp_path / 'lq.json', tmp_path / 'lq.md', tmp_path / 'lq.png'
    result = label_quality.main([str(ifnd_run), '--rate-step', '0.25',
                                 '--out', str(out), '--table', str(table), '--plot', str(picture)])
    captured = capsys.readouterr()
    # A progress line per checkpoint; the rounds after epochs 1 and 2 (epoch 0 has none).
    assert captured.err.count('[1/2] run after epoch 1') == 1 and '[2/2] run after epoch 2' in captured.err
    saved = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(f'{name} in JSON'))
    assert saved['settings']['rates'] == [0.25, 0.5, 0.75, 1.0]
    assert table.read_text().strip() in captured.out and picture.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    (run,) = saved['runs']
    assert run['seed'] == 4 and run['num_clusters'] == KS and run['nested_clusters'] == KS[::-1]
    assert [row['epoch'] for row in run['rounds']] == [1, 2]
    for row, rate in zip(run['rounds'], (0.5, 1.0)):
        assert row['rate'] == rate and row['seed'] == 3 + 7919 * row['epoch']
        assert row['reproduced'] == [1.0, 1.0]  # the run's own round, recomputed from its checkpoint
        assert [level['k'] for level in row['levels']] == KS
        for level in row['levels']:
            for name in ('independent', 'nested'):
                curve = level[name]['curve']
                assert curve['rate'] == [0.25, 0.5, 0.75, 1.0]
                assert len(curve['precision']) == len(curve['recall']) == 4
                assert curve['recall'] == sorted(curve['recall'])  # more accepted, more pairs found
                # The round's rate is on the curve: its operating point lies there.
                at = curve['rate'].index(rate)
                assert (curve['precision'][at], curve['recall'][at]) == \
                    (level[name]['precision'], level[name]['recall'])
    assert [level['k'] for level in saved['summary']['levels']] == KS
    assert len(saved['summary']['rounds']) == 2 * len(KS)

    # Against a direct computation: the run's own saved labels of the round after epoch 1, k = 3.
    own = read_round(str(ifnd_run / 'pseudo_labels' / 'epoch_0001.npz'))
    level = result['runs'][0]['rounds'][0]['levels'][0]
    precision, recall = brute_force_pairs(own['labels'][0], own['true_labels'])
    assert level['independent']['precision'] == pytest.approx(precision)
    assert level['independent']['recall'] == pytest.approx(recall)
    # Every label accepted (rate 1): the pairs of the run's clusters.
    assert (level['independent']['curve']['precision'][-1], level['independent']['curve']['recall'][-1]) \
        == pytest.approx(brute_force_pairs(own['assignments'][0], own['true_labels']))


def test_precision_at_matched_recall_interpolates_within_the_curve_only():
    curve = {'recall': [10.0, 20.0, 40.0], 'precision': [80.0, math.nan, 60.0]}
    assert label_quality.precision_at_recall(curve, 25.0) == pytest.approx(70.0)  # NaN point skipped
    assert math.isnan(label_quality.precision_at_recall(curve, 50.0))
    assert math.isnan(label_quality.precision_at_recall(curve, 5.0))
    assert label_quality.sweep_rates(0.3) == [0.3, 0.6, 0.9, 1.0]


def test_label_quality_refuses_runs_it_cannot_measure_in_one_line(ifnd_run, tmp_path):
    with pytest.raises(SystemExit) as missing:
        label_quality.main([str(ifnd_run), '--epochs', '5'])
    assert str(missing.value.code) == (
        f'error: {ifnd_run}: no clustering round with a checkpoint of its epoch (pseudo_labels/'
        'epoch_000N.npz beside epoch_N.pth) after epoch 5; keep a checkpoint at every round '
        "(default_hooks.checkpoint.interval = the PseudoLabelHook's interval) or pick --epochs among "
        'the rounds kept')
    with pytest.raises(SystemExit) as empty:
        label_quality.main([str(tmp_path)])
    assert str(empty.value.code) == (f'error: no clustering rounds (epoch_NNNN.npz) in {tmp_path}: the '
                                     'run needs PseudoLabelHook with save_labels=True')
