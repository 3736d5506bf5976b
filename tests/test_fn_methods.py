"""The other false-negative methods (debiased loss, hard negatives, FNC) and detection quality,
against float64 references written from the papers' equations with loops over anchors."""
import argparse
import glob
import json
import math
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_BACKBONE, TINY_NECK, digits_config
from loss_references import debiased_contrastive_loss, fnc_loss
from mmengine.config import DictAction
from mmengine.registry import init_default_scope
from test_losses import _grads, _unit

from ifnd.engine.cli import runner_config
from ifnd.evaluation import detection_precision_recall
from ifnd.models.false_negatives.detector import false_negative_detection_counts
from ifnd.models.false_negatives.support_views import fnc_false_negatives
from ifnd.models.losses import contrastive_loss, queue_debiased_loss
from ifnd.registry import HOOKS, MODELS, RUNNERS

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _pairs(num, dim, seed):
    """Unit embeddings of two views whose positives are close, so that some anchors hit the clamp."""
    z1 = _unit(num, dim, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    return z1, F.normalize(z1 + 0.4 * torch.randn(num, dim, generator=g, dtype=z1.dtype), dim=1)


def _debiased_term(pos, negs, tau, tau_plus, beta, clamped):
    """-log(pos / (pos + Ng)) for one anchor, straight from the papers' equations."""
    n = len(negs)
    imp = [neg ** beta for neg in negs]
    reweighted = n * sum(w * neg for w, neg in zip(imp, negs)) / sum(imp)
    ng = (-tau_plus * n * pos + reweighted) / (1 - tau_plus)
    floor = n * math.exp(-1 / tau)
    clamped.append(bool(ng < floor))
    return -torch.log(pos / (pos + torch.clamp(ng, min=floor)))


def reference_debiased(z1, z2, tau, tau_plus, beta, clamped):
    """Chuang et al. / Robinson et al. on SimCLR's 2M views: N = 2M - 2 negatives per anchor."""
    num = z1.shape[0]
    z = torch.cat([z1, z2])
    total = 0.0
    for i in range(2 * num):
        i_pos = (i + num) % (2 * num)
        negs = [torch.exp(z[i] @ z[j] / tau) for j in range(2 * num) if j not in (i, i_pos)]
        total = total + _debiased_term(torch.exp(z[i] @ z[i_pos] / tau), negs, tau, tau_plus,
                                       beta, clamped)
    return total / (2 * num)


def reference_queue_debiased(q, k, queue, tau, tau_plus, beta, clamped):
    """The same on MoCo's queue: each query's negatives are the K queue entries."""
    total = 0.0
    for m in range(q.shape[0]):
        negs = [torch.exp(q[m] @ queue[j] / tau) for j in range(queue.shape[0])]
        total = total + _debiased_term(torch.exp(q[m] @ k[m] / tau), negs, tau, tau_plus, beta,
                                       clamped)
    return total / q.shape[0]


# (tau+, beta, tau, whether the clamp binds for some anchors but not all, on both bases)
DEBIAS_CASES = [(0.3, 0.0, 0.5, True), (0.2, 1.0, 0.2, True), (0.3, 0.5, 0.2, True),
                (0.1, 1.0, 0.5, False), (0.0, 2.0, 0.5, False)]


def _close(got, ref, got_grads, ref_grads):
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(got_grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('tau_plus, beta, tau, mixed', DEBIAS_CASES)
def test_debiased_and_hard_negative_losses_match_the_papers(tau_plus, beta, tau, mixed):
    z1, z2 = _pairs(6, 8, seed=1)
    q, k = _pairs(5, 8, seed=2)
    queue = _unit(12, 8, seed=3)
    for fn, ref_fn, inputs in (
            (lambda a, b: debiased_contrastive_loss(a, b, tau, tau_plus, beta),
             lambda a, b: reference_debiased(a, b, tau, tau_plus, beta, clamped), (z1, z2)),
            (lambda a, b, c: queue_debiased_loss(a, b, c, tau, tau_plus, beta),
             lambda a, b, c: reference_queue_debiased(a, b, c, tau, tau_plus, beta, clamped),
             (q, k, queue))):
        clamped = []
        got, got_grads = _grads(fn, *inputs)
        ref, ref_grads = _grads(ref_fn, *inputs)
        _close(got, ref, got_grads, ref_grads)
        assert (any(clamped) and not all(clamped)) == mixed, clamped  # both branches of the max


def test_debiasing_edge_cases():
    z1, z2 = _pairs(6, 8, seed=4)
    # tau+ = 0 is InfoNCE with the clamp, which never binds: each neg >= e^(-1/t).
    torch.testing.assert_close(debiased_contrastive_loss(z1, z2, 0.5, 0.0, 0.0),
                               contrastive_loss(z1, z2, None, 0.5), rtol=1e-12, atol=1e-12)
    # beta -> 0 is the debiased loss (the reweighting's general path, not the beta = 0 shortcut).
    torch.testing.assert_close(debiased_contrastive_loss(z1, z2, 0.5, 0.1, 1e-9),
                               debiased_contrastive_loss(z1, z2, 0.5, 0.1, 0.0), rtol=1e-8, atol=0)
    # float32, large logits (tau 0.05, beta 2): finite and near the float64 value.
    ref = debiased_contrastive_loss(z1, z2, 0.05, 0.1, 2.0)
    got = debiased_contrastive_loss(z1.float(), z2.float(), 0.05, 0.1, 2.0)
    assert math.isclose(float(got), float(ref), rel_tol=1e-4)
    for tau_plus, beta, match in ((1.0, 0.0, r'\[0, 1\)'), (-0.1, 0.0, r'\[0, 1\)'),
                                  (0.1, -1.0, '>= 0')):
        with pytest.raises(ValueError, match=match):
            debiased_contrastive_loss(z1, z2, 0.5, tau_plus, beta)


def reference_fnc(z1, z2, support, tau, treatment, top_k, threshold, aggregation):
    """FNC by brute force: score every other image per anchor image, pick, then eliminate or
    attract both views of the picked images (SupCon form for attraction)."""
    num = z1.shape[0]
    z = torch.cat([z1, z2])
    picked = []
    for m in range(num):
        scores = {}
        for n in range(num):
            if n != m:
                cosines = [float(support[m, s] @ view[n].detach()) for s in range(support.shape[1])
                           for view in (z1, z2)]
                scores[n] = np.mean(cosines) if aggregation == 'mean' else max(cosines)
        if top_k is not None:
            picked.append(set(sorted(scores, key=scores.get, reverse=True)[:top_k]))
        else:
            picked.append({n for n, score in scores.items() if score > threshold})
    total = 0.0
    for i in range(2 * num):
        i_pos = (i + num) % (2 * num)
        negatives = [j for j in range(2 * num) if j not in (i, i_pos)]
        false = [j for j in negatives if j % num in picked[i % num]]
        if treatment == 'elim':
            denominator, positives = [i_pos] + [j for j in negatives if j not in false], [i_pos]
        else:
            denominator, positives = [i_pos] + negatives, [i_pos] + false
        norm = sum(torch.exp(z[i] @ z[j] / tau) for j in denominator)
        total = total + sum(-torch.log(torch.exp(z[i] @ z[p] / tau) / norm)
                            for p in positives) / len(positives)
    return total / (2 * num)


@pytest.mark.parametrize('treatment, top_k, threshold, aggregation', [
    ('elim', 3, None, 'mean'), ('attr', 2, None, 'max'), ('elim', None, 0.1, 'max'),
    ('attr', None, 0.0, 'mean')])
def test_fnc_matches_brute_force(treatment, top_k, threshold, aggregation):
    z1, z2 = _pairs(8, 6, seed=5)
    support = F.normalize(z1.unsqueeze(1) + 0.5 * _unit(8, 3, 6, seed=6), dim=2)
    args = (0.5, treatment, top_k, threshold, aggregation)
    got, got_grads = _grads(lambda a, b: fnc_loss(a, b, support, *args), z1, z2)
    ref, ref_grads = _grads(lambda a, b: reference_fnc(a, b, support, *args), z1, z2)
    _close(got, ref, got_grads, ref_grads)
    flags = fnc_false_negatives(support, torch.stack([z1, z2]), torch.arange(8), top_k, threshold,
                                aggregation)
    assert not flags.diagonal().any() and flags.any() and not flags.all()
    with pytest.raises(ValueError, match='top_k below 7'):
        fnc_false_negatives(support, torch.stack([z1, z2]), torch.arange(8), top_k=7)


def test_detection_counts_match_brute_force():
    g = torch.Generator().manual_seed(7)
    levels, anchors, candidates = 2, 6, 10
    flagged = torch.rand(levels, anchors, candidates, generator=g) < 0.4
    classes = torch.randint(-1, 3, (candidates, ), generator=g)  # -1: unknown class
    anchor_rows = torch.arange(anchors) + 2  # anchors are candidates 2..7
    positive = (anchor_rows + 1) % candidates
    columns = torch.arange(candidates)
    negatives = (columns != anchor_rows[:, None]) & (columns != positive[:, None])
    counts = false_negative_detection_counts(flagged, negatives, classes[anchor_rows], classes,
                                             levels)
    for level in range(levels):
        found = correct = same = 0
        for a in range(anchors):
            ca = int(classes[anchor_rows[a]])
            for c in range(candidates):
                if c in (int(anchor_rows[a]), int(positive[a])) or ca < 0 or classes[c] < 0:
                    continue
                match = int(classes[c]) == ca
                found += bool(flagged[level, a, c])
                correct += bool(flagged[level, a, c]) and match
                same += match
        assert counts[level].tolist() == [found, correct, same]
    precision, recall = detection_precision_recall(counts)
    np.testing.assert_allclose(precision, 100 * counts[:, 1] / counts[:, 0])
    np.testing.assert_allclose(recall, 100 * counts[:, 1] / counts[:, 2])
    unflagged = false_negative_detection_counts(None, negatives, classes[anchor_rows], classes, 3)
    assert unflagged[:, :2].eq(0).all() and unflagged[:, 2].eq(counts[0, 2]).all()
    assert np.isnan(detection_precision_recall(unflagged)[0]).all()


def _model(cfg):
    torch.manual_seed(0)
    return MODELS.build(dict(cfg, backbone=TINY_BACKBONE, neck=TINY_NECK))


def test_ifnd_step_counts_what_its_loss_eliminates():
    model = _model(dict(type='IFND', temperature=0.5))
    model.track_detection = True
    g = torch.Generator().manual_seed(8)
    pseudo = torch.randint(0, 3, (2, 20), generator=g)
    pseudo[:, :5] = -(torch.arange(5) + 1)  # not accepted: unique labels
    model.label_bank.reset(2, 20)
    model.label_bank.update(pseudo)
    index, classes = torch.randperm(20, generator=g)[:8], torch.randint(0, 3, (8, ), generator=g)
    views = [torch.rand(8, 3, 16, 16, generator=g) for _ in range(2)]
    model.loss(views, {'index': index, 'label': classes})
    want = torch.zeros(2, 3, dtype=torch.float64)
    y, c = pseudo[:, index].repeat(1, 2), classes.repeat(2)
    for i in range(16):
        for j in range(16):
            if j in (i, (i + 8) % 16):
                continue
            for level in range(2):
                flag = bool(y[level, i] == y[level, j])
                want[level] += torch.tensor([flag, flag and c[i] == c[j], c[i] == c[j]])
    torch.testing.assert_close(model.detection_counts, want, rtol=0, atol=0)


def test_algorithms_refuse_bad_settings():
    for cfg, match in (
            (dict(type='DebiasedCL', tau_plus=1.0), r'tau_plus .* \[0, 1\)'),
            (dict(type='HardNegativeCL', beta=-0.5), 'beta'),
            (dict(type='DebiasedMoCo', tau_plus=-0.1, queue_len=16), 'tau_plus'),
            (dict(type='FNC', top_k=0), 'top_k must be an int >= 1'),
            (dict(type='FNC', threshold=0.5), 'exactly one of top_k and threshold'),
            (dict(type='FNC', treatment='supcon'), 'treatment must be None or one of'),
            (dict(type='FNC', aggregation='median'), 'aggregation'),
            (dict(type='FNC', num_support_views=0), r'MultiView\(num_views=2 \+ S\)')):
        with pytest.raises(ValueError, match=match):
            _model(cfg)
    fnc = _model(dict(type='FNC', num_support_views=2, top_k=3))
    views = [torch.rand(4, 3, 16, 16) for _ in range(2)]
    with pytest.raises(ValueError, match='num_views=4 in the MultiView'):
        fnc.loss(views, {})
    with pytest.raises(ValueError, match='top_k below 3'):
        fnc.loss(views * 2, {})


@pytest.mark.parametrize('config', ['debiased/debiased_r18_200e_fmnist.py',
                                    'hard_negative/hard_negative_r18_200e_fmnist.py',
                                    'fnc/fnc_elim_r18_200e_fmnist.py',
                                    'fnc/fnc_attr_r18_200e_fmnist.py',
                                    'ifnd/ifnd_r18_200e_fmnist.py'])
def test_fmnist_configs_take_the_benchmark_overrides(config, tmp_path):
    """The --cfg-options of benchmarks/false_negatives.py (CPU preset, with the method's own
    settings) pass tools/train.py's checks and build the model."""
    from benchmarks import false_negatives as bench
    path = osp.join(REPO, 'configs', config)
    cfg = bench.load_config(path)
    method = next(m for m in bench.METHODS if osp.basename(config).startswith(m))
    options = bench.cfg_options(method, cfg, bench.parse_args(['--preset', 'cpu']), seed=0)
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg = runner_config(path, str(tmp_path), cfg_options=parser.parse_args(
        ['--cfg-options', *options]).cfg_options)
    assert cfg.train_dataloader.batch_size == 128 and cfg.model.temperature == 0.2
    model = MODELS.build(cfg.model)
    assert model.backbone.out_dim == 256
    for key, value in bench.METHODS[method].options.get('cpu', {}).items():
        assert cfg.model[key.split('.', 1)[1]] == value
    hooks = [HOOKS.build(h) for h in cfg.custom_hooks]
    assert hooks[bench.hook_index(cfg, 'KNNEvalHook')].interval == 5
    if 'fnc' in config or 'ifnd' in config:  # appended last: the harness's indices are unchanged
        assert type(hooks[-1]).__name__ == 'FalseNegativeDetectionHook'


def _scalars(work_dir):
    (path, ) = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize('model', [
    dict(type='DebiasedCL', tau_plus=0.1), dict(type='HardNegativeCL', tau_plus=0.1, beta=1.0),
    dict(type='DebiasedMoCo', tau_plus=0.1, queue_len=128, momentum=0.9),
    dict(type='HardNegativeMoCo', tau_plus=0.1, beta=1.0, queue_len=128, momentum=0.9),
    dict(type='FNC', treatment='attr', num_support_views=1, top_k=None, threshold=0.5)],
    ids=lambda m: m['type'] + m.get('treatment', ''))
def test_short_training_runs(model, tmp_path):
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path), dict(model, temperature=0.5), max_epochs=1)
    cfg.train_dataloader.dataset.subset_fraction = 0.4
    cfg.train_dataloader.dataset.pipeline.num_views = 2 + model.get('num_support_views', 0)
    runner = RUNNERS.build(cfg)
    runner.train()
    losses = np.asarray(runner.message_hub.get_scalar('train/loss').data[0])
    assert len(losses) == len(runner.train_dataloader) and np.isfinite(losses).all()
    assert osp.isfile(tmp_path / 'epoch_1.pth')


def test_fnc_trains_and_its_detection_quality_is_logged(tmp_path):
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path), dict(type='FNC', temperature=0.5, num_support_views=2,
                                            top_k=3), max_epochs=2, fn_detection=True)
    cfg.train_dataloader.dataset.subset_fraction = 0.4
    cfg.train_dataloader.dataset.pipeline.num_views = 4
    runner = RUNNERS.build(cfg)
    runner.train()
    logged = [s for s in _scalars(str(tmp_path)) if 'train/fn_precision' in s]
    assert [s['step'] for s in logged] == [1, 2]
    for s in logged:
        assert 0 <= s['train/fn_precision'] <= 100 and 0 < s['train/fn_recall'] <= 100
    # Per epoch only: the iteration records carry no precision or recall.
    assert not [s for s in _scalars(str(tmp_path)) if 'fn_recall' in s]


def test_detection_hook_refuses_a_weighting_alone_and_skips_unlabelled_data():
    import types

    from mmengine.logging import MessageHub, MMLogger
    logged = []
    runner = types.SimpleNamespace(
        epoch=0, logger=MMLogger.get_instance('fn-hook-test'),
        message_hub=MessageHub.get_instance('fn-hook-test'),
        visualizer=types.SimpleNamespace(add_scalars=lambda s, step: logged.append((step, s))))
    hook = HOOKS.build(dict(type='FalseNegativeDetectionHook'))
    runner.model = _model(dict(type='DebiasedMoCo', queue_len=16))  # flags nothing to count
    with pytest.raises(TypeError, match='has a weighting and no detector.*remove the hook from custom_hooks'):
        hook.before_train(runner)
    runner.model = _model(dict(type='IFNDMoCo', queue_len=16))  # its queued keys are counted
    hook.before_train(runner)
    assert runner.model.track_detection
    runner.model = _model(dict(type='FNC', top_k=1, num_support_views=1))
    hook.before_train(runner)
    hook.before_train_epoch(runner)
    assert runner.model.track_detection and runner.model.detection_counts is None
    views = [torch.rand(4, 3, 16, 16) for _ in range(3)]
    runner.model.loss(views, {'label': torch.full((4, ), -1)})  # a data set without labels
    hook.after_train_epoch(runner)
    assert logged == []
    runner.model.loss(views, {'label': torch.tensor([0, 0, 1, 1])})
    hook.after_train_epoch(runner)
    (step, scalars), = logged
    counts = runner.model.detection_counts
    assert step == 1 and scalars['train/fn_precision'] == pytest.approx(100 * counts[0, 1] / counts[0, 0])
