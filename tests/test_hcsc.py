"""HCSC's instance selection (HCSCSelection): the drop probability against a float64 reading of the
paper's equation, the Bernoulli draws' rate, their keys, two processes against one, and a short
run on digits with the clustering hook."""
import glob
import json
import math
import os
import os.path as osp

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import digits_config, end_gloo_worker, free_port, run_ranks
from mmengine.registry import init_default_scope
from test_distributed import DIGITS, EVAL_VIEW, GLOBAL_BATCH, WORLD_SIZE, _batch, _build

from ifnd.models.false_negatives import HCSCSelection, NegativeBatch, PseudoLabelBank
from ifnd.models.false_negatives.hcsc import pair_uniforms
from ifnd.registry import HOOKS, MODELS, RUNNERS

NUM_SAMPLES = 40
KS = [3, 5, 4]  # per level; the bank pads the centroids to the largest


def _detector(seed: int = 0, **settings) -> HCSCSelection:
    """A detector over a bank of random labels, centroids and concentrations (3 levels)."""
    gen = torch.Generator().manual_seed(seed)
    detector = HCSCSelection(**settings)
    bank = PseudoLabelBank()
    bank.reset(len(KS), NUM_SAMPLES)
    labels = torch.stack([torch.randint(0, k, (NUM_SAMPLES, ), generator=gen) for k in KS])
    labels[:, :3] = -(torch.arange(3) + 1)  # three unaccepted samples: they flag nothing
    centroids = F.normalize(torch.randn(len(KS), max(KS), 8, generator=gen), dim=-1)
    concentration = 0.1 + torch.rand(len(KS), max(KS), generator=gen)
    bank.update(labels, centroids, concentration, KS)
    detector.attach(bank)
    detector.setup(NUM_SAMPLES, 10, torch.device('cpu'))
    return detector


def _batch_of(anchor_index, candidate_index, seed: int = 1, views: int = 1) -> NegativeBatch:
    gen = torch.Generator().manual_seed(seed)
    anchors = F.normalize(torch.randn(len(anchor_index), 8, generator=gen), dim=1)
    candidates = F.normalize(torch.randn(len(candidate_index), 8, generator=gen), dim=1)
    return NegativeBatch(anchors=anchors, candidates=candidates,
                         negatives=torch.ones(len(anchor_index), len(candidate_index), dtype=torch.bool),
                         anchor_index=torch.as_tensor(anchor_index),
                         candidate_index=torch.as_tensor(candidate_index), views=views)


def _reference(detector: HCSCSelection, batch: NegativeBatch) -> np.ndarray:
    """p_ij^l = exp(z_j·μ_y/φ_y) / Σ_c exp(z_j·μ_c/φ_c), y the anchor's cluster, φ rescaled to mean
    T; at least the floor; 0 for an anchor with no label. Float64 loops."""
    bank, temp = detector.bank, detector.selection_temperature
    cands = batch.candidates.double().numpy()
    out = np.zeros((len(KS), len(batch.anchor_index), len(cands)))
    for level, k in enumerate(KS):
        mu = bank.centroids[level, :k].double().numpy()
        phi = bank.concentration[level, :k].double().numpy()
        phi = temp * phi / phi.mean()
        for i, sample in enumerate(batch.anchor_index.tolist()):
            y = int(bank.labels[level, sample])
            if y < 0:
                continue
            for j, z in enumerate(cands):
                e = [math.exp(float(z @ mu[c]) / phi[c]) for c in range(k)]
                out[level, i, j] = max(e[y] / sum(e), detector.floor)
    return out


@pytest.mark.parametrize('temperature', [0.2, 0.05, 1.0])
def test_probability_matches_the_paper_in_float64(temperature):
    detector = _detector(selection_temperature=temperature)
    batch = _batch_of(torch.arange(12), torch.arange(5, 30))
    prob = detector.probabilities(batch)
    assert prob.shape == (3, 12, 25)
    np.testing.assert_allclose(prob.double().numpy(), _reference(detector, batch), rtol=1e-4,
                               atol=1e-6)
    assert prob[:, :3].eq(0).all() and (prob[:, 3:] >= detector.floor).all()


def test_uniform_concentration_without_the_rounds_phi():
    detector = _detector(concentration=False)
    detector.bank.concentration.fill_(1.0)  # what _reference rescales to T: the same
    batch = _batch_of(torch.arange(8), torch.arange(10))
    np.testing.assert_allclose(detector.probabilities(batch).double().numpy(),
                               _reference(detector, batch), rtol=1e-4, atol=1e-6)


def test_flag_rate_is_the_probability():
    detector = _detector()
    batch = _batch_of(torch.arange(3, 13), torch.arange(20, 40))
    prob = detector.probabilities(batch).double()
    epochs = 400
    flagged = torch.zeros_like(prob)
    for epoch in range(epochs):
        detector.set_epoch(epoch)
        flagged += detector(batch).double()
    # All pairs together: the flagged count is a sum of independent Bernoulli draws.
    z = (flagged.sum() - epochs * prob.sum()) / (epochs * prob * (1 - prob)).sum().sqrt()
    assert abs(float(z)) < 4
    # Each pair alone (600 of them): none further than 5 standard deviations.
    sd = (epochs * prob * (1 - prob)).sqrt().clamp(min=0.5)
    assert ((flagged - epochs * prob).abs() / sd).max() < 5


def test_draws_depend_on_seed_epoch_and_sample_indices_only():
    detector = _detector()
    batch = _batch_of(torch.arange(4, 12), torch.arange(10, 30))
    detector.set_epoch(3)
    draws = detector.uniforms(batch)
    assert torch.equal(draws, detector.uniforms(batch))
    # Another order of the same samples: the same draw for each pair.
    perm_a, perm_c = torch.randperm(8), torch.randperm(20)
    shuffled = _batch_of(batch.anchor_index[perm_a], batch.candidate_index[perm_c])
    assert torch.equal(detector.uniforms(shuffled), draws[:, perm_a][:, :, perm_c])
    # A part of the batch (one process's anchors): the same draws as in the whole.
    assert torch.equal(detector.uniforms(_batch_of(batch.anchor_index[:4], batch.candidate_index)),
                       draws[:, :4])
    detector.set_epoch(4)
    assert (detector.uniforms(batch) != draws).float().mean() > 0.99
    other = HCSCSelection(seed=1)
    other.attach(detector.bank)
    other.setup(NUM_SAMPLES, 10, torch.device('cpu'))
    other.set_epoch(3)
    assert (other.uniforms(batch) != draws).float().mean() > 0.99
    # The levels draw apart, and the draws look uniform.
    assert (draws[0] != draws[1]).float().mean() > 0.99
    assert abs(float(draws.mean()) - 0.5) < 0.05 and draws.min() >= 0 and draws.max() < 1


def test_views_and_unknown_candidates_get_their_own_draws():
    u = pair_uniforms(0, 0, 0, torch.tensor([5, 5]), torch.tensor([0, 1]), torch.tensor([7, -1, -2]))
    assert u[0, 0] != u[1, 0]  # the anchor's two views
    assert u[0, 1] != u[0, 2]  # two queue rows of unknown index, keyed by their columns


def test_nothing_before_a_round_and_wrong_centroid_width():
    detector = HCSCSelection()
    bank = PseudoLabelBank()
    bank.reset(2, NUM_SAMPLES)
    detector.attach(bank)
    detector.setup(NUM_SAMPLES, 10, torch.device('cpu'))
    assert detector(_batch_of(torch.arange(4), torch.arange(6))) is None
    detector = _detector()
    batch = _batch_of(torch.arange(4), torch.arange(6))
    batch.candidates = torch.randn(6, 16)
    with pytest.raises(ValueError, match="feature='z'"):
        detector(batch)


@pytest.mark.parametrize('key, value', [('selection_temperature', 0), ('floor', 1.0),
                                        ('floor', -0.1), ('seed', -1), ('seed', 0.5)])
def test_settings_are_checked(key, value):
    with pytest.raises((ValueError, TypeError), match=f'HCSCSelection {key}') as err:
        HCSCSelection(**{key: value})
    assert '\n' not in str(err.value)


@pytest.mark.parametrize('preset, base', [('HCSC', 'SimCLR'), ('HCSCMoCo', 'MoCoV2'),
                                          ('HCSCMoCoV3', 'MoCoV3')])
def test_presets_build_with_elimination(preset, base):
    init_default_scope('ifnd')
    model = _build(preset)
    assert isinstance(model, MODELS.get(base)) and model.treatment == 'elim'
    assert isinstance(model.detector, HCSCSelection) and model.detector.bank is model.label_bank
    assert model.temperature != model.detector.selection_temperature or preset != 'HCSC'
    with pytest.raises(ValueError, match='preset'):
        MODELS.build(dict(type=preset, backbone={}, neck={}, detector=dict(type='PseudoLabels')))


def _round(model, work_dir: str) -> None:
    """One clustering round with PCL's concentrations, every label accepted."""
    hook = HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5, 10], score='pcl',
                            acceptance=dict(type='ConstantAcceptance', final_rate=1.0),
                            dataset=DIGITS, pipeline=EVAL_VIEW, batch_size=32, num_workers=0,
                            kmeans=dict(niter=10, nredo=1), save_labels=False))
    import types
    from mmengine.logging import MMLogger
    runner = types.SimpleNamespace(
        model=model, max_epochs=10, work_dir=work_dir, logger=MMLogger.get_instance('hcsc-test'),
        visualizer=types.SimpleNamespace(add_scalars=lambda *args, **kwargs: None))
    model.label_bank.reset(2, 269)
    hook.run_round(runner, 1)
    model.detector.setup(269, 10, torch.device('cpu'))
    model.detector.set_epoch(3)
    if hasattr(model, 'queue'):  # queued keys of known samples and classes, as after a few steps
        model.queue_index.copy_(torch.arange(len(model.queue)) % 269)
        model.queue_label.copy_(model.queue_index % 10)


def _step(model, views, samples):
    torch.manual_seed(2)  # MoCo's key shuffle: rank 0 draws it as one process does
    model.track_detection = model.records_detection  # the counts must add up over the ranks
    losses = model.loss(views, samples)
    counts = model.detection_counts
    return losses['loss'].detach(), losses['hcsc_drop_prob'], counts


def _worker(rank: int, port: int, model_type: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    model = _build(model_type)
    _round(model, out_dir)
    views, samples = _batch()
    shard = slice(rank * GLOBAL_BATCH // WORLD_SIZE, (rank + 1) * GLOBAL_BATCH // WORLD_SIZE)
    loss, _, counts = _step(model, [v[shard] for v in views],
                            {k: v[shard] for k, v in samples.items()})
    dist.all_reduce(loss)
    dist.all_reduce(counts)  # the batch's views (SimCLR), the queued keys' classes (MoCo)
    if rank == 0:
        torch.save({'loss': loss / WORLD_SIZE, 'counts': counts}, osp.join(out_dir, 'dist.pt'))
    end_gloo_worker()


@pytest.mark.parametrize('model_type', ['HCSC', 'HCSCMoCo'])
def test_two_processes_flag_as_one(tmp_path, model_type):
    run_ranks(_worker, (free_port(), model_type, str(tmp_path)), WORLD_SIZE)
    got = torch.load(tmp_path / 'dist.pt', weights_only=True)
    model = _build(model_type)
    _round(model, str(tmp_path))
    assert model.label_bank.concentration.std() > 0  # PCL's φ, per prototype
    loss, drop, counts = _step(model, *_batch())
    assert 0 < drop < 1
    assert counts[:, 0].sum() > 0  # something was flagged
    torch.testing.assert_close(got['counts'], counts, rtol=0, atol=0)
    # The loss is the flags' too: a flag drawn otherwise on a process would change it.
    torch.testing.assert_close(got['loss'], loss, rtol=1e-5, atol=1e-6)


def test_short_run_on_digits_logs_detection(tmp_path):
    work_dir = tmp_path / 'run'
    cfg = digits_config(str(work_dir), dict(type='HCSC', temperature=0.5), max_epochs=2,
                        pseudo_labels=dict(num_clusters=[5, 10], score='pcl',
                                           acceptance=dict(type='StepAcceptance', step_epoch=1),
                                           kmeans=dict(niter=5, nredo=1)),
                        fn_detection=True)
    cfg.train_dataloader.dataset.subset_fraction = 0.1  # 2 iterations an epoch
    torch.manual_seed(0)
    RUNNERS.build(cfg).train()
    (path, ) = glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        scalars = [json.loads(line) for line in f]
    steps = [s for s in scalars if 'loss' in s]
    assert len(steps) == 4 and np.isfinite([s['loss'] for s in steps]).all()
    # Nothing flagged in the warm-up epoch; from epoch 2 a drop probability is logged.
    assert all('hcsc_drop_prob' not in s for s in steps[:2])
    assert all(0 < s['hcsc_drop_prob'] < 1 for s in steps[2:])
    detection = [s for s in scalars if 'train/fn_recall' in s]
    assert [s['step'] for s in detection] == [1, 2]
    assert detection[0]['train/fn_recall'] == 0 and detection[1]['train/fn_recall'] > 0
    assert 0 < detection[1]['train/fn_precision'] <= 100


def test_mocov3_step_drops_the_batch_keys(tmp_path):
    model = _build('HCSCMoCoV3')
    _round(model, str(tmp_path))
    loss, drop, counts = _step(model, *_batch())
    assert torch.isfinite(loss) and 0 < drop < 1
    assert counts is not None and counts[:, 0].sum() > 0
