"""Losses against float64 brute-force references written straight from the paper's equations."""
import math

import pytest
import torch
import torch.nn.functional as F
from loss_references import (contrastive_loss_from_candidates, label_masks, masked_info_nce,
                             queue_contrastive_loss)

from ifnd.models.losses import contrastive_loss, proto_nce_loss

TREATMENTS = (None, 'elim', 'attr')


def _unit(*shape, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=dtype), dim=-1)


def _pseudo_labels(levels, num, seed, num_clusters=3):
    """Labels with shared cluster ids and some unique (rejected) negative labels."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_clusters, (levels, num), generator=g)
    rejected = (torch.rand(levels, num, generator=g) < 0.2) | (torch.arange(num) % 4 == 0)
    unique = -(torch.arange(num) + 1).expand(levels, num)
    return torch.where(rejected, unique, labels)


def _sim(u, v, tau):
    return torch.exp(torch.dot(u, v) / tau)


def reference_contrastive(z1, z2, labels, tau, treatment):
    """Eqs. eq:contrastive / eq:elimination / eq:attraction with explicit loops over anchors."""
    num = z1.shape[0]
    z = torch.cat([z1, z2])
    if labels is None:
        levels = [None]
    else:
        labels = labels if labels.ndim == 2 else labels.unsqueeze(0)
        levels = [[int(row[v % num]) for v in range(2 * num)] for row in labels]
    total = 0.0
    for y in levels:
        level_loss = 0.0
        for i in range(2 * num):
            i_pos = (i + num) % (2 * num)
            negatives = [n for n in range(2 * num) if n not in (i, i_pos)]
            same = [n for n in negatives if y is not None and y[n] == y[i]]
            if treatment == 'elim':
                denominator_set = [i_pos] + [n for n in negatives if n not in same]
                positive_set = [i_pos]
            elif treatment == 'attr':
                denominator_set = [i_pos] + negatives
                positive_set = [i_pos] + same
            else:
                denominator_set = [i_pos] + negatives
                positive_set = [i_pos]
            denominator = sum(_sim(z[i], z[s], tau) for s in denominator_set)
            level_loss = level_loss + sum(-torch.log(_sim(z[i], z[p], tau) / denominator)
                                          for p in positive_set) / len(positive_set)
        total = total + level_loss / (2 * num)
    return total / len(levels)


def reference_queue(q, k, queue, labels, queue_labels, tau, treatment):
    """MoCo form: candidates are the own key and the queue, with the paper's label rules."""
    if labels is None:
        levels = [(None, None)]
    else:
        labels = labels if labels.ndim == 2 else labels.unsqueeze(0)
        queue_labels = queue_labels if queue_labels.ndim == 2 else queue_labels.unsqueeze(0)
        levels = list(zip(labels.tolist(), queue_labels.tolist()))
    total = 0.0
    for y, yq in levels:
        level_loss = 0.0
        for m in range(q.shape[0]):
            same = [j for j in range(queue.shape[0]) if y is not None and yq[j] == y[m]]
            others = [j for j in range(queue.shape[0]) if j not in same]
            pos_sims = [_sim(q[m], k[m], tau)]
            if treatment == 'elim':
                den_sims = pos_sims + [_sim(q[m], queue[j], tau) for j in others]
            else:
                den_sims = pos_sims + [_sim(q[m], queue[j], tau) for j in range(queue.shape[0])]
                if treatment == 'attr':
                    pos_sims = pos_sims + [_sim(q[m], queue[j], tau) for j in same]
            denominator = sum(den_sims)
            level_loss = level_loss + sum(-torch.log(s / denominator)
                                          for s in pos_sims) / len(pos_sims)
        total = total + level_loss / q.shape[0]
    return total / len(levels)


def _grads(fn, *tensors):
    tensors = [t.detach().clone().requires_grad_(True) for t in tensors]
    value = fn(*tensors)
    return value.detach(), torch.autograd.grad(value, tensors)


@pytest.mark.parametrize('treatment', TREATMENTS)
@pytest.mark.parametrize('label_kind', ['none', 'vector', 'levels'])
def test_contrastive_loss_matches_reference(treatment, label_kind):
    num, dim, tau = 6, 8, 0.1
    z1, z2 = _unit(num, dim, seed=1), _unit(num, dim, seed=2)
    labels = {'none': None, 'vector': _pseudo_labels(1, num, seed=3)[0],
              'levels': _pseudo_labels(3, num, seed=4)}[label_kind]
    if labels is not None:
        assert (labels >= 0).any() and (labels < 0).any()
    got, got_grads = _grads(lambda a, b: contrastive_loss(a, b, labels, tau, treatment), z1, z2)
    ref, ref_grads = _grads(lambda a, b: reference_contrastive(a, b, labels, tau, treatment), z1, z2)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(got_grads, ref_grads):
        assert not torch.isnan(g).any()
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)
    # float32 inputs agree with the float64 reference up to single precision.
    got32 = contrastive_loss(z1.float(), z2.float(), labels, tau, treatment)
    assert got32.dtype == torch.float32
    assert math.isclose(float(got32), float(ref), rel_tol=1e-5)


def test_treatments_differ_with_shared_labels_and_agree_with_unique_ones():
    num, tau = 8, 0.2
    z1, z2 = _unit(num, 5, seed=5), _unit(num, 5, seed=6)
    shared = _pseudo_labels(2, num, seed=7)
    values = {m: float(contrastive_loss(z1, z2, shared, tau, m)) for m in TREATMENTS}
    assert len(set(values.values())) == 3
    unique = -(torch.arange(num) + 1)
    inst = contrastive_loss(z1, z2, None, tau, None)
    for treatment in TREATMENTS:
        torch.testing.assert_close(contrastive_loss(z1, z2, unique, tau, treatment), inst)
        torch.testing.assert_close(contrastive_loss(z1, z2, None, tau, treatment), inst)


@pytest.mark.parametrize('treatment', TREATMENTS)
def test_distributed_split_sums_to_full_loss(treatment):
    """Two 'ranks' each use their local views as anchors against all gathered views."""
    num, tau, ranks = 8, 0.1, 2
    z1, z2 = _unit(num, 6, seed=8), _unit(num, 6, seed=9)
    labels = _pseudo_labels(2, num, seed=10)
    full = contrastive_loss(z1, z2, labels, tau, treatment)
    local = num // ranks
    # Each rank holds cat(z1_r, z2_r); the gather concatenates the ranks.
    parts = [(z1[r * local:(r + 1) * local], z2[r * local:(r + 1) * local],
              labels[:, r * local:(r + 1) * local]) for r in range(ranks)]
    candidates = torch.cat([torch.cat([a, b]) for a, b, _ in parts])
    candidate_labels = torch.cat([torch.cat([y, y], dim=1) for _, _, y in parts], dim=1)
    total = 0.0
    for r, (a, b, y) in enumerate(parts):
        offset = r * 2 * local
        idx = torch.arange(local)
        self_index = offset + torch.cat([idx, idx + local])
        positive_index = offset + torch.cat([idx + local, idx])
        per_anchor = contrastive_loss_from_candidates(torch.cat([a, b]), candidates,
                                                      positive_index, self_index,
                                                      torch.cat([y, y], dim=1), candidate_labels,
                                                      tau, treatment)
        assert per_anchor.shape == (2 * local, )
        total = total + per_anchor.sum()
    torch.testing.assert_close(total, full * 2 * num)


@pytest.mark.parametrize('treatment', TREATMENTS)
@pytest.mark.parametrize('label_kind', ['none', 'vector', 'levels'])
def test_queue_loss_matches_reference(treatment, label_kind):
    num, size, dim, tau = 5, 9, 6, 0.2
    q, k, queue = _unit(num, dim, seed=11), _unit(num, dim, seed=12), _unit(size, dim, seed=13)
    if label_kind == 'none':
        labels = queue_labels = None
    else:
        levels = 1 if label_kind == 'vector' else 2
        labels = _pseudo_labels(levels, num, seed=14)
        queue_labels = _pseudo_labels(levels, size, seed=15)
        # Unknown queue entries carry labels that match nothing.
        queue_labels[:, :2] = -1000 - torch.arange(2)
        if label_kind == 'vector':
            labels, queue_labels = labels[0], queue_labels[0]
    fn = lambda a, b, c: queue_contrastive_loss(a, b, c, labels, queue_labels, tau, treatment)  # noqa
    ref_fn = lambda a, b, c: reference_queue(a, b, c, labels, queue_labels, tau, treatment)  # noqa
    got, got_grads = _grads(fn, q, k, queue)
    ref, ref_grads = _grads(ref_fn, q, k, queue)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(got_grads, ref_grads):
        assert not torch.isnan(g).any()
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)


def test_queue_inst_equals_moco_cross_entropy():
    num, size, tau = 7, 20, 0.2
    q, k, queue = (_unit(num, 16, seed=16, dtype=torch.float32),
                   _unit(num, 16, seed=17, dtype=torch.float32),
                   _unit(size, 16, seed=18, dtype=torch.float32))
    moco = F.cross_entropy(torch.cat([(q * k).sum(1, keepdim=True), q @ queue.t()], 1) / tau,
                           torch.zeros(num, dtype=torch.long))
    torch.testing.assert_close(queue_contrastive_loss(q, k, queue, temperature=tau), moco)
    labels = _pseudo_labels(2, num, seed=19)
    queue_labels = _pseudo_labels(2, size, seed=20) - 100  # never matches the batch
    for treatment in TREATMENTS:
        torch.testing.assert_close(
            queue_contrastive_loss(q, k, queue, labels, queue_labels, tau, treatment), moco)


def reference_proto(z, centroids, assignments, concentration):
    total = 0.0
    for level, (cents, phi) in enumerate(zip(centroids, concentration)):
        terms = []
        for m in range(z.shape[0]):
            a = int(assignments[level, m])
            if a < 0:
                continue
            scores = [torch.exp(torch.dot(z[m], cents[j]) / phi[j]) for j in range(len(cents))]
            terms.append(-torch.log(scores[a] / sum(scores)))
        total = total + (sum(terms) / len(terms) if terms else 0.0)
    return total / len(centroids)


def test_proto_nce_matches_reference():
    num, dim = 10, 6
    z = _unit(num, dim, seed=21)
    ks = (3, 5, 4)
    centroids = [_unit(k, dim, seed=22 + i) for i, k in enumerate(ks)]
    g = torch.Generator().manual_seed(25)
    concentration = [0.05 + 0.2 * torch.rand(k, generator=g, dtype=torch.float64) for k in ks]
    assignments = torch.stack([torch.randint(0, k, (num, ), generator=g) for k in ks])
    assignments[0, :4] = -1  # not accepted
    assignments[2] = -1  # a level with nothing accepted contributes 0
    got, (grad, ) = _grads(lambda x: proto_nce_loss(x, centroids, assignments, concentration), z)
    ref, (ref_grad, ) = _grads(lambda x: reference_proto(x, centroids, assignments,
                                                         concentration), z)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(grad, ref_grad)
    # Nothing accepted anywhere: zero loss, zero (not NaN) gradients.
    none = torch.full_like(assignments, -1)
    value, (grad, ) = _grads(lambda x: proto_nce_loss(x, centroids, none, concentration), z)
    assert float(value) == 0.0 and torch.count_nonzero(grad) == 0


def test_masked_info_nce_no_nan_and_definition():
    g = torch.Generator().manual_seed(30)
    logits = torch.randn(4, 6, generator=g, dtype=torch.float64) * 5
    positive = torch.zeros(4, 6, dtype=torch.bool)
    positive[torch.arange(4), torch.tensor([1, 2, 3, 4])] = True
    positive[0, 5] = True
    denominator = torch.rand(4, 6, generator=g) < 0.5
    denominator |= positive
    positive[3] = False  # a row without positives yields 0, not NaN
    logits.requires_grad_(True)
    loss = masked_info_nce(logits, positive, denominator)
    loss.sum().backward()
    assert not torch.isnan(logits.grad).any()
    assert torch.count_nonzero(logits.grad[:3][~denominator[:3]]) == 0
    assert torch.count_nonzero(logits.grad[3]) == 0
    assert float(loss[3].detach()) == 0.0
    for i in range(3):
        lse = torch.logsumexp(logits[i][denominator[i]], 0)
        expected = -(logits[i][positive[i]] - lse).mean()
        torch.testing.assert_close(loss[i], expected)


def test_label_masks_and_errors():
    anchor = torch.tensor([0, 1, -3])
    cand = torch.tensor([0, 1, -3, 0])
    positive = torch.eye(3, 4, dtype=torch.bool).roll(1, 1)  # positives at columns 1, 2, 3
    excluded = torch.eye(3, 4, dtype=torch.bool)
    pos, den = label_masks(anchor, cand, positive, excluded, 'elim')
    assert pos.equal(positive) and not den[0, 3] and den[0, 1] and not den[0, 0]
    pos, den = label_masks(anchor, cand, positive, excluded, 'attr')
    assert pos[0, 3] and pos[0, 1] and den[0, 3] and not pos[0, 0]
    with pytest.raises(ValueError, match='treatment must be None or one of'):
        label_masks(anchor, cand, positive, excluded, 'bogus')
    z = _unit(4, 3, seed=31)
    with pytest.raises(ValueError, match='shape'):
        contrastive_loss(z, _unit(5, 3, seed=32))
    with pytest.raises(ValueError, match='labels'):
        contrastive_loss(z, z, torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"treatment must be None or one of \('elim', 'attr', 'zero'\)"):
        contrastive_loss(z, z, treatment='supcon')
    with pytest.raises(ValueError, match='together'):
        queue_contrastive_loss(z, z, z, labels=torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize('algorithm, treatment', [('SupCon', 'attr'), ('OracleElim', 'elim')])
def test_ground_truth_oracles_apply_their_equation_to_the_batch_labels(algorithm, treatment):
    """SupCon is Eq. 4 and the elimination oracle Eq. 3, both with the ground-truth labels."""
    from helpers import TINY_BACKBONE, TINY_NECK
    from mmengine.registry import init_default_scope

    from ifnd.registry import MODELS
    init_default_scope('ifnd')
    torch.manual_seed(0)
    model = MODELS.build(dict(type=algorithm, backbone=TINY_BACKBONE, neck=TINY_NECK,
                              temperature=0.3)).double()  # float64 weights, f(x) in float64
    assert model.treatment == treatment and model.needs.classes and not hasattr(model, 'label_bank')
    views = [torch.randn(8, 3, 16, 16, dtype=torch.float64) for _ in range(2)]
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2])
    data = {'index': torch.arange(8), 'label': labels}
    z1, z2 = model.embed_views(views)
    loss = model.batch_losses(z1, z2, data)['loss']
    # The model's embeddings are float32 (also under autocast); the reference runs in float64.
    expected = reference_contrastive(z1.double(), z2.double(), labels, 0.3, treatment)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(loss, model.neck.parameters(), retain_graph=True)
    want = torch.autograd.grad(expected, model.neck.parameters())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-6)
    # Different labels give a different loss: the batch's labels are used, not ignored.
    instance = reference_contrastive(z1.double(), z2.double(), None, 0.3, None)
    assert not torch.isclose(loss.double(), instance)
