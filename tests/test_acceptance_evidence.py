"""Acceptance by evidence (κ far enough towards certainty, stability across rounds, agreement across levels)
against brute-force references, the pair precision / recall of the flags, and short real runs."""
import json
import os
import os.path as osp
import shutil

import numpy as np
import pytest
import torch
from helpers import digits_config, run_script

from ifnd.clustering import (ConfidentAcceptance, StableAcceptance, build_acceptance,
                             match_clusters)
from ifnd.evaluation.metrics import pair_precision_recall
from ifnd.models.false_negatives import NegativeBatch, PseudoLabelBank, PseudoLabels

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
STATE = 'pseudo_label_acceptance'  # where a checkpoint keeps the acceptance's state


def _random_round(seed: int, num: int = 200, k: int = 7):
    g = torch.Generator().manual_seed(seed)
    assigned = torch.randint(0, k, (num,), generator=g)
    kappa = torch.rand(num, generator=g)
    previous = torch.randint(0, k + 2, (num,), generator=g)
    return assigned, kappa, previous


def _stable(previous=None) -> StableAcceptance:
    acceptance = StableAcceptance()
    if previous is not None:
        acceptance.end_round([previous])
    return acceptance


@pytest.mark.parametrize('seed', range(5))
@pytest.mark.parametrize('share', [0.0, 0.3, 0.77, 0.999])
@pytest.mark.parametrize('k', [2, 7, 100])
def test_confident_acceptance_matches_a_loop(seed, share, k):
    """κ at least ``share`` of the way from chance (1/k) to certainty, at a level of k clusters."""
    assigned, kappa, _ = _random_round(seed, k=k)
    kappa[::17] = float('nan')  # never accepted
    labels, smallest = ConfidentAcceptance(certainty_share=share).accept(0, assigned, kappa, k)
    bound = 1 / k + share * (1 - 1 / k)
    want, kept = [], []
    for i, (a, q) in enumerate(zip(assigned.tolist(), kappa.double().tolist())):
        ok = q == q and q >= bound
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
    labels, _ = _stable(previous).accept(0, assigned, torch.zeros(len(assigned)), 7)
    want = [a if match[a] == p else -(i + 1)
            for i, (a, p) in enumerate(zip(assigned.tolist(), previous.tolist()))]
    assert labels.tolist() == want


def test_stability_accepts_relabelled_clusters_and_nothing_without_a_previous_round():
    """Cluster ids are arbitrary per round: a permuted clustering is wholly stable."""
    previous = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    scores = torch.zeros(8)
    assert _stable(previous).accept(0, torch.tensor([2, 2, 2, 0, 0, 1, 1, 1]), scores, 3)[0].ge(0).all()
    moved = torch.tensor([2, 2, 0, 0, 0, 1, 1, 1])  # sample 2 changed cluster
    assert _stable(previous).accept(0, moved, scores, 3)[0].lt(0).tolist() == [False, False, True] + [False] * 5
    labels, smallest = _stable().accept(0, previous, scores, 3)
    assert labels.tolist() == [-(i + 1) for i in range(8)] and smallest == float('inf')


def test_stable_acceptance_remembers_the_round_it_ends_and_forgets_on_reset():
    acceptance = StableAcceptance()
    first = torch.tensor([0, 0, 1, 1])
    acceptance.end_round([first, first])
    assert acceptance.accept(1, first, torch.zeros(4), 2)[0].tolist() == [0, 0, 1, 1]
    assert torch.equal(acceptance.state_dict()['previous'][1], first)
    assert acceptance.check_samples(5) and acceptance.state_dict() == {}  # another size: set aside
    acceptance.end_round([first])
    acceptance.reset()
    assert acceptance.state_dict() == {}


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
    config = _config(tmp_path, 'agreement', dict(type='IFND', temperature=0.5, agreement=3),
                     dict(acceptance=dict(type='ConstantAcceptance')))
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


CONFIDENT = 'PseudoLabelHook acceptance ConfidentAcceptance'


@pytest.mark.parametrize('settings, match', [
    (dict(acceptance=dict(type='ConfidentAcceptance', certainty_share=None)),
     f'{CONFIDENT} certainty_share must be a float in'),
    (dict(acceptance=dict(type='ConfidentAcceptance', certainty_share=1.5)),
     rf'{CONFIDENT} certainty_share must be a float in \[0, 1\)'),
    (dict(acceptance=dict(type='ConfidentAcceptance', certainty_share=1.0)),
     r'certainty_share must be a float in \[0, 1\), got 1\.0.*never reaches'),
    (dict(acceptance=dict(type='LinearAcceptance', certainty_share=0.5)),
     'LinearAcceptance takes final_rate, interval, seed, not certainty_share'),
    (dict(acceptance=dict(type='ConfidentAcceptance'), score='pcl'), "reads the score kappa"),
    (dict(acceptance=dict(type='LinearAcceptance', seed=3)), "seed=3 orders the samples of a detector"),
    (dict(acceptance=dict(type='CosineAcceptance')), 'type must be one of ConstantAcceptance'),
    (dict(acceptance=dict(final_rate=0.5)), r'must be a dict\(type=\.\.\., \.\.\.\)'),
])
def test_the_hook_refuses_acceptance_settings_that_cannot_work(settings, match):
    from ifnd.hooks import PseudoLabelHook
    with pytest.raises((TypeError, ValueError), match=match):
        PseudoLabelHook(num_clusters=[10], **settings)


def test_a_detector_acceptance_refuses_the_evidence_schemes():
    from ifnd.models.false_negatives import GroundTruth
    with pytest.raises(ValueError, match="StableAcceptance accepts by a clustering round's evidence"):
        GroundTruth(acceptance=dict(type='StableAcceptance'))


def test_every_scheme_is_built_from_its_registered_name():
    """A config's acceptance=dict(type=...) builds the registered class with its settings checked."""
    from ifnd.registry import ACCEPTANCES
    assert set(ACCEPTANCES.module_dict) == {'ConstantAcceptance', 'StepAcceptance', 'LinearAcceptance',
                                            'ConfidentAcceptance', 'StableAcceptance'}
    built = build_acceptance(dict(type='StepAcceptance', step_epoch=3, final_rate=0.5), 'owner')
    built.set_epoch(2, 10)
    assert built.rate == 0.0 and built.owner == 'owner StepAcceptance'
    built.set_epoch(3, 10)
    assert built.rate == 0.5


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
    done = run_script('tools/train.py', config, '--work-dir', work_dir, *extra)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _rounds(work_dir) -> list[dict]:
    with open(osp.join(work_dir, 'pseudo_labels', 'rounds.json')) as f:
        return json.load(f)


@pytest.mark.parametrize('name, model, pseudo_labels', [
    ('confidence', dict(type='IFND', temperature=0.5),
     dict(acceptance=dict(type='ConfidentAcceptance', certainty_share=0.0))),
    ('agreement', dict(type='IFND', temperature=0.5, agreement=2),
     dict(acceptance=dict(type='ConstantAcceptance'))),
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
    config = _config(tmp_path, 'stability', dict(type='IFND', temperature=0.5),
                     dict(acceptance=dict(type='StableAcceptance')))
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
    for a, b in zip(whole[STATE]['previous'], again[STATE]['previous']):
        assert torch.equal(a, b)
    # Damaged state in a checkpoint (ids out of [0, k), or assignments of another data set's size) is
    # set aside with a warning: the round accepts nothing, the run ends with a checkpoint that resumes.
    good = torch.load(tmp_path / 'whole' / 'epoch_2.pth', map_location='cpu', weights_only=False)
    kept = good[STATE]['previous']
    # A checkpoint written before acceptance was a part keeps the same state under its former key.
    former = {k: v for k, v in good.items() if k != STATE}
    for name, damage, key in (('former key', [lambda a: a] * 2, 'pseudo_label_previous'),
                              ('huge and negative ids', [lambda a: a + 2 ** 40, lambda a: a - 100], STATE),
                              ('another size', [lambda a: a[:7]] * 2, STATE)):
        damaged = tmp_path / name.replace(' ', '_')
        shutil.copytree(tmp_path / 'whole', damaged)
        os.remove(damaged / 'epoch_3.pth')
        previous = [hurt(a) for hurt, a in zip(damage, kept)]
        state = previous if key == 'pseudo_label_previous' else {'previous': previous}
        torch.save({**former, key: state}, damaged / 'epoch_2.pth')
        _train(config, damaged, '--resume', str(damaged / 'epoch_2.pth'))
        resumable = torch.load(damaged / 'epoch_3.pth', map_location='cpu', weights_only=False)
        assert [len(a) for a in resumable[STATE]['previous']] == [len(a) for a in kept]
        if name == 'former key':  # read as the state it is: the same run as the uninterrupted one
            assert torch.equal(resumable['state_dict'][labels], whole['state_dict'][labels])
            continue
        log = ''.join(p.read_text() for p in damaged.glob('*/*.log'))
        assert 'set aside' in log and 'accepts nothing' in log, name
        assert _rounds(damaged)[-1]['rate'] == 0.0


def test_the_documented_acceptance_example_drives_the_hook_and_a_detector():
    """docs/methods.md's "Adding an acceptance scheme": its file, as written, and one config line."""
    from ifnd.hooks import PseudoLabelHook
    from ifnd.models.false_negatives import GroundTruth
    from ifnd.registry import ACCEPTANCES
    text = open(osp.join(REPO, 'docs', 'methods.md')).read()
    code = text.split('## Adding an acceptance scheme', 1)[1].split('```python\n', 1)[1].split('```', 1)[0]
    ACCEPTANCES._module_dict.pop('CosineAcceptance', None)
    try:
        exec(compile(code, 'docs/methods.md', 'exec'), {})
        hook = PseudoLabelHook(num_clusters=[3], acceptance=dict(type='CosineAcceptance'))
        rates = []
        for epoch in (0, 5, 10):
            hook.acceptance.set_epoch(epoch, 10)
            rates.append(hook.acceptance.rate)
        assert rates == pytest.approx([0.0, 0.5, 1.0])
        labels, _ = hook.acceptance.accept(0, torch.tensor([0, 1, 2, 0]), torch.tensor([0.1, 0.9, 0.5, 0.2]), 3)
        assert labels.tolist() == [0, 1, 2, 0]  # rate 1: all
        detector = GroundTruth(acceptance=dict(type='CosineAcceptance', seed=1))
        detector.setup(10, 10, torch.device('cpu'))
        detector.set_epoch(5)
        assert int(detector.accepted(torch.arange(10)).sum()) == 5  # ⌈0.5 · 10⌉
        with pytest.raises(ValueError, match='CosineAcceptance final_rate must be a float in'):
            GroundTruth(acceptance=dict(type='CosineAcceptance', final_rate=2.0))
    finally:
        ACCEPTANCES._module_dict.pop('CosineAcceptance', None)


def test_the_presets_take_their_detectors_settings():
    """IFND(agreement=2) is SimCLR with PseudoLabels(agreement=2); OracleElim(acceptance=...) the
    schedule-matched oracle; a preset without a detector refuses them."""
    from helpers import TINY_BACKBONE, TINY_NECK
    from mmengine.registry import init_default_scope
    from ifnd.registry import MODELS
    init_default_scope('ifnd')
    parts = dict(backbone=TINY_BACKBONE, neck=TINY_NECK)
    ifnd = MODELS.build(dict(type='IFND', agreement=2, **parts))
    simclr = MODELS.build(dict(type='SimCLR', treatment='elim',
                               detector=dict(type='PseudoLabels', agreement=2), **parts))
    assert (type(ifnd.detector), ifnd.detector.agreement, ifnd.treatment) == \
        (type(simclr.detector), 2, simclr.treatment)
    moco = MODELS.build(dict(type='IFNDMoCo', agreement=3, queue_len=16, **parts))
    assert moco.detector.agreement == 3
    oracle = MODELS.build(dict(type='OracleElim', acceptance=dict(type='LinearAcceptance', seed=2), **parts))
    assert type(oracle.detector.acceptance).__name__ == 'LinearAcceptance' and oracle.detector.acceptance.seed == 2
    with pytest.raises(ValueError, match='PCL with treatment=None flags nothing, so it has no PseudoLabels '
                                         'to take agreement'):
        MODELS.build(dict(type='PCL', agreement=2, **parts))
    with pytest.raises(ValueError, match=r'PseudoLabels agreement must be an int in \[1, 64\]'):
        MODELS.build(dict(type='IFND', agreement=0, **parts))
