"""Acceptance by evidence (confidence threshold, stability across rounds, agreement across levels)
against brute-force references, the pair precision / recall of the flags, and short real runs."""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import digits_config

from ifnd.clustering import accept_confident, accept_level, accept_stable, match_clusters
from ifnd.evaluation.metrics import pair_precision_recall
from ifnd.models.false_negatives import NegativeBatch, PseudoLabelBank, PseudoLabels

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _random_round(seed: int, num: int = 200, k: int = 7):
    g = torch.Generator().manual_seed(seed)
    assigned = torch.randint(0, k, (num,), generator=g)
    kappa = torch.rand(num, generator=g)
    previous = torch.randint(0, k + 2, (num,), generator=g)
    return assigned, kappa, previous


@pytest.mark.parametrize('seed', range(5))
@pytest.mark.parametrize('threshold', [0.0, 0.3, 0.77, 1.0])
def test_confidence_threshold_matches_a_loop(seed, threshold):
    assigned, kappa, _ = _random_round(seed)
    kappa[::17] = float('nan')  # never accepted
    labels, smallest = accept_confident(assigned, kappa, threshold)
    want, kept = [], []
    for i, (a, q) in enumerate(zip(assigned.tolist(), kappa.double().tolist())):
        ok = q == q and q >= threshold
        want.append(a if ok else -(i + 1))
        if ok:
            kept.append(q)
    assert labels.tolist() == want
    assert smallest == (min(kept) if kept else float('inf'))


@pytest.mark.parametrize('seed', range(5))
def test_clusters_match_across_rounds_by_their_largest_overlap(seed):
    assigned, _, previous = _random_round(seed)
    assigned[assigned == 3] = 4  # cluster 3 empty: matched to nothing
    match = match_clusters(assigned, previous)
    for c in range(int(assigned.max()) + 1):
        overlaps = [sum(1 for a, p in zip(assigned.tolist(), previous.tolist()) if a == c and p == q)
                    for q in range(int(previous.max()) + 1)]
        best = max(overlaps)
        assert match[c] == (-1 if best == 0 else overlaps.index(best))  # ties: the lower id
    labels, share = accept_stable(assigned, previous)
    want = [a if match[a] == p else -(i + 1)
            for i, (a, p) in enumerate(zip(assigned.tolist(), previous.tolist()))]
    assert labels.tolist() == want
    assert share == pytest.approx(sum(v >= 0 for v in want) / len(want))


def test_stability_accepts_relabelled_clusters_and_nothing_without_a_previous_round():
    """Cluster ids are arbitrary per round: a permuted clustering is wholly stable."""
    previous = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    assert accept_stable(torch.tensor([2, 2, 2, 0, 0, 1, 1, 1]), previous)[0].ge(0).all()
    moved = torch.tensor([2, 2, 0, 0, 0, 1, 1, 1])  # sample 2 changed cluster
    assert accept_stable(moved, previous)[0].lt(0).tolist() == [False, False, True] + [False] * 5
    labels, share = accept_stable(previous, None)
    assert labels.tolist() == [-(i + 1) for i in range(8)] and share == 0.0


def test_a_level_is_accepted_by_the_scheme_it_names():
    assigned, kappa, previous = _random_round(9)
    # The threshold is the share of the way from chance (1/k) to certainty: 0.5 at k = 7 is 4/7.
    assert torch.equal(accept_level(assigned, kappa, 1.0, 'confidence', 0.5, k=7)[0],
                       accept_confident(assigned, kappa, 1 / 7 + 0.5 * 6 / 7)[0])
    assert torch.equal(accept_level(assigned, kappa, 0.0, 'stability', None, previous)[0],
                       accept_stable(assigned, previous)[0])
    with pytest.raises(ValueError, match="evidence must be None or one of"):
        accept_level(assigned, kappa, 0.5, 'calendar')


@pytest.mark.parametrize('agreement', [1, 2, 3])
def test_agreement_flags_only_pairs_that_share_labels_at_enough_levels(agreement):
    g = torch.Generator().manual_seed(agreement)
    num, levels = 30, 3
    bank = PseudoLabelBank()
    labels = torch.randint(0, 3, (levels, num), generator=g)
    labels = torch.where(torch.rand(levels, num, generator=g) < 0.8, labels, -(torch.arange(num) + 1))
    bank.reset(levels, num)
    bank.update(labels)
    detector = PseudoLabels(agreement=agreement)
    detector.attach(bank)
    anchors, candidates = torch.arange(0, 12), torch.arange(5, 30)
    batch = NegativeBatch(torch.zeros(12, 4), torch.zeros(25, 4), torch.ones(12, 25, dtype=torch.bool),
                          anchors, candidates)
    flags = detector(batch)
    for level in range(levels):
        for a_pos, a in enumerate(anchors.tolist()):
            for c_pos, c in enumerate(candidates.tolist()):
                same = [bool(labels[m, a] == labels[m, c] and labels[m, a] >= 0) or a == c
                        for m in range(levels)]
                assert bool(flags[level, a_pos, c_pos]) == (same[level] and sum(same) >= agreement)


def test_agreement_is_checked(tmp_path):
    """Past the stated 64, or more levels than the run clusters at: no pair could ever be flagged."""
    for value in (0, 65):
        with pytest.raises(ValueError, match=r'PseudoLabels agreement must be an int in \[1, 64\]'):
            PseudoLabels(agreement=value)
    from helpers import train_error
    config = _config(tmp_path, 'agreement', dict(type='SimCLR', temperature=0.5, treatment='elim',
                                                 detector=dict(type='PseudoLabels', agreement=3)),
                     dict(scheme='constant'))
    message = train_error(config, '--work-dir', str(tmp_path / 'run'))
    assert message.startswith('error: PseudoLabels agreement=3 asks labels to agree at more levels than '
                              'PseudoLabelHook clusters at (2: num_clusters=[10, 20])'), message


@pytest.mark.parametrize('seed', range(4))
def test_pair_precision_and_recall_match_the_pairs_counted_one_by_one(seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 4, 60)
    labels = np.where(rng.random(60) < 0.7, rng.integers(0, 5, 60), -(np.arange(60) + 1))
    flagged = correct = same = 0
    for i in range(60):
        for j in range(60):
            if i != j:
                flagged += labels[i] == labels[j]
                correct += labels[i] == labels[j] and truth[i] == truth[j]
                same += truth[i] == truth[j]
    precision, recall = pair_precision_recall(labels, truth)
    assert precision == pytest.approx(100 * correct / flagged)
    assert recall == pytest.approx(100 * correct / same)
    assert np.isnan(pair_precision_recall(-(np.arange(5) + 1), np.zeros(5))[0])


@pytest.mark.parametrize('settings, match', [
    (dict(scheme='confidence'), 'threshold must be a float in'),
    (dict(scheme='confidence', threshold=1.5), r'threshold must be a float in \[0, 1\)'),
    (dict(scheme='confidence', threshold=1.0), r'threshold must be a float in \[0, 1\), got 1\.0.*never reaches'),
    (dict(scheme='linear', threshold=0.5), "threshold=0.5 is the 'confidence' scheme's"),
    (dict(scheme='confidence', threshold=0.5, confidence='pcl'), "thresholds κ"),
])
def test_the_hook_refuses_evidence_settings_that_cannot_work(settings, match):
    from ifnd.hooks import PseudoLabelHook
    with pytest.raises((TypeError, ValueError), match=match):
        PseudoLabelHook(num_clusters=[10], **settings)


def test_a_detector_schedule_refuses_the_evidence_schemes():
    from ifnd.models.false_negatives import GroundTruth
    with pytest.raises(ValueError, match="accepts by a clustering round's evidence"):
        GroundTruth(acceptance=dict(scheme='stability'))


def _config(tmp_path, name: str, model: dict, pseudo_labels: dict, epochs: int = 3) -> str:
    cfg = digits_config(str(tmp_path / name), model, max_epochs=epochs,
                        pseudo_labels=dict(num_clusters=[10, 20], interval=1,
                                           kmeans=dict(nredo=1, niter=10), **pseudo_labels))
    cfg.train_dataloader.dataset.subset_fraction = 0.2
    cfg.default_hooks.checkpoint.interval = 1
    path = str(tmp_path / f'{name}.py')
    cfg.dump(path)
    return path


def _train(config: str, work_dir, *extra: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS='1')
    done = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'train.py'), config, '--work-dir',
                           str(work_dir), *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _rounds(work_dir) -> list[dict]:
    with open(osp.join(work_dir, 'pseudo_labels', 'rounds.json')) as f:
        return json.load(f)


@pytest.mark.parametrize('name, model, pseudo_labels', [
    ('confidence', dict(type='IFND', temperature=0.5), dict(scheme='confidence', threshold=0.0)),
    ('agreement', dict(type='SimCLR', temperature=0.5, treatment='elim',
                       detector=dict(type='PseudoLabels', agreement=2)), dict(scheme='constant')),
])
def test_each_option_trains_through_train_py_and_reports_its_flags(tmp_path, name, model, pseudo_labels):
    """Per round: the accepted share and the flags' precision and recall in rounds.json."""
    _train(_config(tmp_path, name, model, pseudo_labels, epochs=2), tmp_path / name)
    rounds = _rounds(tmp_path / name)
    assert [r['epoch'] for r in rounds] == [0, 1, 2]
    for level in rounds[-1]['levels']:
        assert {'accept_rate', 'mtpr', 'flag_precision', 'flag_recall'} <= set(level)
        assert level['accept_rate'] > 0 and 0 < level['flag_precision'] <= 100
        assert 0 < level['flag_recall'] <= 100
    if name == 'confidence':
        # No calendar: the share is the evidence's, the same over the run as κ sharpens or not.
        assert rounds[0]['rate'] == pytest.approx(np.mean([lv['accept_rate'] for lv in rounds[0]['levels']]))


def test_stability_resumes_exactly_with_the_previous_rounds_assignments(tmp_path):
    """The round after a resume decides by the checkpoint's previous assignments, as if never stopped."""
    config = _config(tmp_path, 'stability', dict(type='IFND', temperature=0.5), dict(scheme='stability'))
    _train(config, tmp_path / 'whole')
    rounds = _rounds(tmp_path / 'whole')
    assert rounds[0]['rate'] == 0.0 and rounds[-1]['rate'] > 0  # nothing before a previous round
    resumed = tmp_path / 'resumed'
    shutil.copytree(tmp_path / 'whole', resumed)
    for late in ('epoch_3.pth',):
        os.remove(resumed / late)
    _train(config, resumed, '--resume', str(resumed / 'epoch_2.pth'))
    whole = torch.load(tmp_path / 'whole' / 'epoch_3.pth', map_location='cpu', weights_only=False)
    again = torch.load(resumed / 'epoch_3.pth', map_location='cpu', weights_only=False)
    labels = 'label_bank.labels'
    assert torch.equal(whole['state_dict'][labels], again['state_dict'][labels])
    for a, b in zip(whole['pseudo_label_previous'], again['pseudo_label_previous']):
        assert torch.equal(a, b)
    # Damaged state in a checkpoint (ids out of [0, k), or assignments of another data set's size) is
    # set aside with a warning: the round accepts nothing, the run ends with a checkpoint that resumes.
    good = torch.load(tmp_path / 'whole' / 'epoch_2.pth', map_location='cpu', weights_only=False)
    for name, damage in (('huge and negative ids', [lambda a: a + 2 ** 40, lambda a: a - 100]),
                         ('another size', [lambda a: a[:7]] * 2)):
        damaged = tmp_path / name.replace(' ', '_')
        shutil.copytree(tmp_path / 'whole', damaged)
        os.remove(damaged / 'epoch_3.pth')
        previous = [hurt(a) for hurt, a in zip(damage, good['pseudo_label_previous'])]
        torch.save(dict(good, pseudo_label_previous=previous), damaged / 'epoch_2.pth')
        _train(config, damaged, '--resume', str(damaged / 'epoch_2.pth'))
        log = ''.join(p.read_text() for p in damaged.glob('*/*.log'))
        assert 'set aside' in log and 'accepts nothing' in log, name
        assert _rounds(damaged)[-1]['rate'] == 0.0
        resumable = torch.load(damaged / 'epoch_3.pth', map_location='cpu', weights_only=False)
        assert [len(a) for a in resumable['pseudo_label_previous']] == [len(a) for a in good['pseudo_label_previous']]
