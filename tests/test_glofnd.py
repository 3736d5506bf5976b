"""GloFND's detector: its update and flags against a float64 loop, its start epoch, its state
through a checkpoint and resume, and two gloo processes against one."""
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import TINY_BACKBONE, TINY_NECK, digits_config, end_gloo_worker, free_port, run_ranks
from mmengine.registry import init_default_scope
from test_distributed import GLOBAL_BATCH, WORLD_SIZE

from ifnd.models.false_negatives import GloFND, NegativeBatch
from ifnd.registry import MODELS, RUNNERS

CPU = torch.device('cpu')
BUFFERS = ('threshold', 'exp_avg', 'exp_avg_sq', 'steps')


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def reference_glofnd(batches: list[NegativeBatch], num_samples: int, alpha: float, lr: float,
                     betas=(0.9, 0.98), eps=1e-8) -> tuple[dict, list]:
    """GloFND in float64 loops: per step, each image i of the batch (its ``views`` anchor rows
    sharing λ_i) takes g_i = α − (its rows' negatives with cosine > λ_i) / (its rows' negatives),
    then one Adam step on λ_i (bias correction by i's own update count, λ clamped to [−1, 1],
    λ starting at 1); the flags are the negatives above the updated λ."""
    lam, avg, avg_sq, steps = [1.0] * num_samples, [0.0] * num_samples, [0.0] * num_samples, \
        [0] * num_samples
    all_flags = []
    for batch in batches:
        sims = (batch.anchors.double() @ batch.candidates.double().t()).tolist()
        negatives = batch.negatives.tolist()
        rows = len(sims)
        per_view = rows // batch.views
        images = batch.anchor_index[:per_view].tolist()
        for b, i in enumerate(images):
            own_rows = [b + v * per_view for v in range(batch.views)]
            count = sum(negatives[r][c] for r in own_rows for c in range(len(sims[r])))
            above = sum(negatives[r][c] and sims[r][c] > lam[i] for r in own_rows
                        for c in range(len(sims[r])))
            grad = alpha - above / max(count, 1)
            steps[i] += 1
            avg[i] = betas[0] * avg[i] + (1 - betas[0]) * grad
            avg_sq[i] = betas[1] * avg_sq[i] + (1 - betas[1]) * grad * grad
            corrected = avg[i] / (1 - betas[0] ** steps[i])
            scale = math.sqrt(avg_sq[i] / (1 - betas[1] ** steps[i])) + eps
            lam[i] = min(max(lam[i] - lr * corrected / scale, -1.0), 1.0)
        all_flags.append(torch.tensor(
            [[negatives[r][c] and sims[r][c] > lam[images[r % per_view]]
              for c in range(len(sims[r]))] for r in range(rows)]))
    state = dict(threshold=torch.tensor(lam), exp_avg=torch.tensor(avg),
                 exp_avg_sq=torch.tensor(avg_sq), steps=torch.tensor(steps))
    return state, all_flags


def _simclr_batch(gen: torch.Generator, num_samples: int, num: int = 5,
                  dim: int = 4) -> NegativeBatch:
    """SimCLR's form in one process: anchors and candidates cat([z1, z2]), the two views of an
    image sharing its index; negatives all but the view itself and its positive."""
    z1 = F.normalize(torch.randn(num, dim, generator=gen), dim=1)
    z2 = F.normalize(z1 + 0.3 * torch.randn(num, dim, generator=gen), dim=1)
    views = torch.cat([z1, z2])
    index = torch.randperm(num_samples, generator=gen)[:num]
    rows = torch.arange(2 * num)
    columns = rows.unsqueeze(0)
    negatives = (columns != rows[:, None]) & (columns != ((rows + num) % (2 * num))[:, None])
    return NegativeBatch(anchors=views, candidates=views, negatives=negatives,
                         anchor_index=index.repeat(2), candidate_index=index.repeat(2), views=2)


def _moco_batch(gen: torch.Generator, num_samples: int, num: int = 5, dim: int = 4,
                queue_len: int = 12) -> NegativeBatch:
    """MoCo's form: the queries against the queue, every queue row a negative."""
    return NegativeBatch(
        anchors=F.normalize(torch.randn(num, dim, generator=gen), dim=1),
        candidates=F.normalize(torch.randn(queue_len, dim, generator=gen), dim=1),
        negatives=torch.ones(num, queue_len, dtype=torch.bool),
        anchor_index=torch.randperm(num_samples, generator=gen)[:num],
        candidate_index=torch.randint(-1, num_samples, (queue_len, ), generator=gen))


@pytest.mark.parametrize('form, alpha, lr', [('simclr', 0.2, 0.2), ('moco', 0.2, 0.2),
                                              ('simclr', 0.9, 1.5)])  # λ clamped at −1
def test_glofnd_matches_a_float64_loop(form, alpha, lr):
    num_samples = 12
    gen = torch.Generator().manual_seed(0)
    make = _simclr_batch if form == 'simclr' else _moco_batch
    batches = [make(gen, num_samples) for _ in range(10)]  # 5 of 12 samples a step: repeats
    detector = GloFND(alpha=alpha, lr=lr)
    detector.setup(num_samples, 10, CPU)
    detector.set_epoch(0)
    got = [detector(batch) for batch in batches]
    want_state, want_flags = reference_glofnd(batches, num_samples, alpha, lr)
    for name in BUFFERS:
        torch.testing.assert_close(getattr(detector, name).double(), want_state[name].double(),
                                   rtol=1e-5, atol=1e-6, msg=name)
    for step, (flags, want, batch) in enumerate(zip(got, want_flags, batches)):
        assert flags.shape == (1, ) + batch.negatives.shape
        assert torch.equal(flags[0] & batch.negatives, want), step
    # The data exercise both terms of g: some steps count negatives above λ; with α = 0.2 λ moves
    # both ways, with α = 0.9 it is pushed down to the clamp.
    flagged = torch.stack([f.sum() for f in want_flags])
    assert (flagged > 0).sum() >= 3 and (want_state['steps'] >= 3).any()
    assert want_state['threshold'].min() < 0.9
    assert (want_state['exp_avg'] < 0).any() == (alpha == 0.2)
    assert (want_state['threshold'] == -1).any() == (alpha == 0.9)


def test_glofnd_starts_at_its_start_epoch_and_learns_only_in_training():
    gen = torch.Generator().manual_seed(1)
    detector = GloFND(alpha=0.2, lr=0.3, start_epoch=2)
    detector.setup(12, 5, CPU)
    batch = _simclr_batch(gen, 12)
    fresh = {name: getattr(detector, name).clone() for name in BUFFERS}
    for epoch in (0, 1):
        detector.set_epoch(epoch)
        assert detector(batch) is None
    for name in BUFFERS:
        assert torch.equal(getattr(detector, name), fresh[name]), name
    detector.set_epoch(2)
    flags = detector(batch)
    assert flags is not None and flags.shape == (1, 10, 10)
    images = batch.anchor_index[:5]
    assert detector.steps[images].eq(1).all() and detector.steps.sum() == 5
    assert (detector.threshold[images] < 1).all()
    others = torch.ones(12, dtype=torch.bool)
    others[images] = False
    assert detector.threshold[others].eq(1).all()
    detector.eval()  # evaluation flags with λ as it stands and learns nothing
    held = detector.threshold.clone()
    again = detector(batch)
    assert torch.equal(detector.threshold, held) and detector.steps.sum() == 5
    assert torch.equal(again, flags)


def _glofnd_run(work_dir, max_epochs, name, **overrides):
    cfg = digits_config(str(work_dir), dict(
        type='SimCLR', temperature=0.5, treatment='elim',
        detector=dict(type='GloFND', alpha=0.1, start_epoch=1, lr=0.5)), max_epochs=max_epochs,
        experiment_name=name, **overrides)
    cfg.train_dataloader.dataset.subset_fraction = 0.1  # 2 iterations an epoch
    runner = RUNNERS.build(cfg)
    runner.train()
    return runner


def test_glofnd_state_is_saved_and_resumed(tmp_path):
    whole = _glofnd_run(tmp_path / 'whole', 3, 'whole')
    _glofnd_run(tmp_path / 'cut', 2, 'cut')
    saved = torch.load(tmp_path / 'cut' / 'epoch_2.pth', weights_only=False)['state_dict']
    resumed = _glofnd_run(tmp_path / 'cut', 3, 'resumed', resume=True)
    detector = whole.model.detector
    assert detector.steps.max() == 2 and detector.threshold.min() < 0.9, 'λ learnt in 2 epochs'
    assert saved['detector.steps'].max() == 1  # one epoch of updates at the checkpoint
    for name in BUFFERS:
        torch.testing.assert_close(getattr(resumed.model.detector, name), getattr(detector, name),
                                   rtol=0, atol=0, msg=name)
    final = torch.load(tmp_path / 'whole' / 'epoch_3.pth', weights_only=False)['state_dict']
    for name in BUFFERS:
        torch.testing.assert_close(final[f'detector.{name}'], getattr(detector, name), rtol=0,
                                   atol=0)
    state, resumed_state = whole.model.state_dict(), resumed.model.state_dict()
    assert state.keys() == resumed_state.keys()
    for key, value in state.items():
        torch.testing.assert_close(resumed_state[key], value, rtol=0, atol=0, msg=key)


DIST_STEPS, DIST_SAMPLES = 3, 12


def _dist_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = MODELS.build(dict(type='SimCLR', temperature=0.5, backbone=TINY_BACKBONE,
                              neck=TINY_NECK, treatment='elim',
                              detector=dict(type='GloFND', alpha=0.2, lr=0.5)))
    # BN in eval mode normalises each sample alone, so shards and the whole batch agree exactly
    # (as in test_distributed); the detector learns λ, as in training.
    model.eval()
    model.detector.train()
    model.detector.setup(DIST_SAMPLES, 1, CPU)
    model.detector.set_epoch(0)
    model.track_detection = True
    return model


def _dist_batches() -> list[tuple[list[torch.Tensor], dict]]:
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(DIST_STEPS):  # 8 of 12 samples a step: each sample in several steps
        views = [torch.rand(GLOBAL_BATCH, 3, 16, 16, generator=gen) for _ in range(2)]
        batches.append((views, {'index': torch.randperm(DIST_SAMPLES, generator=gen)[:GLOBAL_BATCH],
                                'label': torch.randint(0, 3, (GLOBAL_BATCH, ), generator=gen)}))
    return batches


def _dist_steps(model, shard=slice(None)) -> list[dict]:
    results = []
    for views, samples in _dist_batches():
        model.zero_grad()
        model.detection_counts = None
        local = {key: value[shard] for key, value in samples.items()}
        loss = model.loss([v[shard] for v in views], local)['loss']
        loss.backward()
        results.append({'loss': loss.detach(), 'counts': model.detection_counts,
                        'grads': {n: p.grad.clone() for n, p in model.named_parameters()
                                  if p.grad is not None}})
    return results


def _dist_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    init_default_scope('ifnd')
    model = _dist_model()
    size = GLOBAL_BATCH // WORLD_SIZE
    results = _dist_steps(model, slice(rank * size, (rank + 1) * size))
    for result in results:  # what DDP and FalseNegativeDetectionHook do
        dist.all_reduce(result['loss'])
        result['loss'] /= WORLD_SIZE
        dist.all_reduce(result['counts'])
        for grad in result['grads'].values():
            dist.all_reduce(grad)
            grad /= WORLD_SIZE
    buffers = {name: getattr(model.detector, name) for name in BUFFERS}
    torch.save({'results': results, 'buffers': buffers}, os.path.join(out_dir, f'rank{rank}.pt'))
    end_gloo_worker()


def test_two_processes_learn_the_thresholds_of_one(tmp_path):
    run_ranks(_dist_worker, (free_port(), str(tmp_path)), WORLD_SIZE)
    ranks = [torch.load(tmp_path / f'rank{rank}.pt', weights_only=True)
             for rank in range(WORLD_SIZE)]
    model = _dist_model()
    results = _dist_steps(model)
    for name in BUFFERS:
        assert torch.equal(ranks[0]['buffers'][name], ranks[1]['buffers'][name]), name
        torch.testing.assert_close(ranks[0]['buffers'][name], getattr(model.detector, name),
                                   rtol=1e-5, atol=1e-6, msg=name)
    assert model.detector.steps.max() >= 2, 'samples updated in several steps'
    flagged = torch.stack([r['counts'][0, 0] for r in results])
    assert (flagged > 0).any(), 'some negatives flagged'
    for step, (got, want) in enumerate(zip(ranks[0]['results'], results)):
        torch.testing.assert_close(got['loss'], want['loss'], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got['counts'], want['counts'], rtol=0, atol=0)
        assert got['grads'].keys() == want['grads'].keys()
        for name, grad in want['grads'].items():
            torch.testing.assert_close(got['grads'][name], grad, rtol=1e-4, atol=1e-6,
                                       msg=f'step {step}: {name}')
