"""HCSC whole: its prototype selection and ProtoNCE against float64 readings of the authors' code
(hirl-team/HCSC at cec852d, hcsc/hcsc.py: get_protos, sample_neg_protos), the dropped logits zeroed
or removed, the instance losses of the levels summed or averaged, and the presets' options."""
import math
import types

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_BACKBONE, TINY_NECK
from mmengine.registry import init_default_scope

from ifnd.models.false_negatives.hcsc import (PROTOTYPE_KEEP_RANGE, HCSCPrototypes,
                                              prototype_keep_probability)
from ifnd.models.losses import masked_nce, proto_nce_loss
from ifnd.registry import MODELS

KS = [6, 4, 2]  # nested, fine to coarse
DIM, NUM_SAMPLES = 8, 30


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _bank(seed: int = 0, nested: bool = True) -> types.SimpleNamespace:
    """A label bank of three nested levels (the labels composed through the parents), as a
    clustering round leaves it."""
    gen = torch.Generator().manual_seed(seed)
    parents = [torch.randint(0, KS[level + 1], (KS[level], ), generator=gen) for level in range(2)]
    first = torch.randint(0, KS[0], (NUM_SAMPLES, ), generator=gen)
    labels = [first, parents[0][first], parents[1][parents[0][first]]]
    padded = torch.full((3, max(KS)), -1, dtype=torch.long)
    for level, p in enumerate(parents):
        padded[level, :KS[level]] = p if nested else -1
    centroids = F.normalize(torch.randn(3, max(KS), DIM, generator=gen, dtype=torch.float64), dim=-1)
    concentration = 0.1 + torch.rand(3, max(KS), generator=gen, dtype=torch.float64)
    stacked = torch.stack(labels)
    return types.SimpleNamespace(
        cluster_counts=KS, centroids=centroids, concentration=concentration, parents=padded,
        has_parents=[nested, nested, False], labels=stacked,
        lookup=lambda index: stacked[:, index])


def keep_reference(bank, level: int, positive: int, temperature: float) -> list[float]:
    """1 − softmax over the parent level's prototypes of μ_c·μ'_c' / φ'_c' at the parent of the
    positive prototype, φ' rescaled to mean T (sample_neg_protos), clamped to [0.0001, 0.999]; per
    prototype c of the level, element by element in float64."""
    k, k_up = KS[level], KS[level + 1]
    phi = [float(bank.concentration[level + 1, c]) for c in range(k_up)]
    phi = [temperature * p / (sum(phi) / k_up) for p in phi]
    parent = int(bank.parents[level, positive])
    out = []
    for c in range(k):
        logits = [float(bank.centroids[level, c] @ bank.centroids[level + 1, u]) / phi[u] for u in range(k_up)]
        prob = 1 - math.exp(logits[parent]) / sum(math.exp(x) for x in logits)
        out.append(min(max(prob, PROTOTYPE_KEEP_RANGE[0]), PROTOTYPE_KEEP_RANGE[1]))
    return out


def proto_reference(z: torch.Tensor, bank, labels: torch.Tensor, kept: list, zeroed: bool) -> float:
    """ProtoNCE of get_protos: per level, −log of the positive prototype's exp(z·μ/φ) over the
    positive's and the kept negatives' (a dropped one: exp(0) with ``zeroed``, else nothing), the
    mean over the anchors, then over the levels; element by element in float64."""
    total = 0.0
    for level, k in enumerate(KS):
        level_sum = 0.0
        for a in range(len(z)):
            y = int(labels[level, a])
            terms = []
            for c in range(k):
                logit = float(z[a] @ bank.centroids[level, c]) / float(bank.concentration[level, c])
                keep = c == y or kept[level] is None or bool(kept[level][a, c])
                if keep:
                    terms.append(logit)
                elif zeroed:
                    terms.append(0.0)
            pos = float(z[a] @ bank.centroids[level, y]) / float(bank.concentration[level, y])
            level_sum += math.log(sum(math.exp(x) for x in terms)) - pos
        total += level_sum / len(z)
    return total / len(KS)


def test_prototype_keep_probability_matches_the_authors_sampling():
    bank = _bank()
    temperature = 0.2
    for level in range(2):
        phi = bank.concentration[level + 1, :KS[level + 1]]
        phi = temperature * phi / phi.mean()
        positives = torch.arange(KS[level])
        got = prototype_keep_probability(bank.centroids[level, :KS[level]],
                                         bank.centroids[level + 1, :KS[level + 1]], phi,
                                         bank.parents[level, positives])
        for a, positive in enumerate(positives.tolist()):
            # Computed in float32 (the bank's dtype), as the training step does.
            assert got[a].tolist() == pytest.approx(keep_reference(bank, level, positive, temperature),
                                                    rel=1e-5, abs=1e-6)


@pytest.mark.parametrize('zeroed', [False, True], ids=['removed', 'zeroed'])
def test_proto_nce_with_selected_prototypes_matches_a_float64_reference(zeroed):
    bank = _bank(1)
    gen = torch.Generator().manual_seed(2)
    index = torch.randperm(NUM_SAMPLES, generator=gen)[:5]
    z = F.normalize(torch.randn(5, DIM, generator=gen, dtype=torch.float64), dim=1).requires_grad_()
    labels = bank.lookup(index)
    kept = [torch.rand(5, k, generator=gen) < 0.5 for k in KS[:2]] + [None]
    centroids = [bank.centroids[level, :k] for level, k in enumerate(KS)]
    phi = [bank.concentration[level, :k] for level, k in enumerate(KS)]
    loss = proto_nce_loss(z, centroids, labels, phi, kept, zeroed)
    assert loss.item() == pytest.approx(proto_reference(z.detach(), bank, labels, kept, zeroed), rel=1e-12)
    # Every prototype kept is PCL's ProtoNCE, whatever zeroed says.
    plain = proto_nce_loss(z, centroids, labels, phi)
    assert proto_nce_loss(z, centroids, labels, phi, [None] * 3, zeroed).item() == plain.item()
    assert plain.item() == pytest.approx(proto_reference(z.detach(), bank, labels, [None] * 3, zeroed), rel=1e-12)
    loss.backward()
    assert torch.isfinite(z.grad).all()


def test_prototype_term_draws_by_the_keep_probability_and_only_on_nested_levels():
    """The draws keep each negative prototype at its probability (over many anchors), the same for
    the same keys; a level with no parent (the coarsest, or independent levels) keeps all."""
    bank = _bank(3)
    term = HCSCPrototypes(selection=True, selection_temperature=0.2, seed=4)
    index = torch.arange(NUM_SAMPLES).repeat(200)  # many anchors: 200 views of each sample
    z = torch.zeros(len(index), DIM, dtype=torch.float64)
    labels = bank.lookup(index)
    kept = term.kept(bank, z, labels, index, views=200, epoch=1)
    assert kept[2] is None and kept[0] is not None and kept[1] is not None
    for level in range(2):
        phi = bank.concentration[level + 1, :KS[level + 1]]
        probability = prototype_keep_probability(bank.centroids[level, :KS[level]],
                                                 bank.centroids[level + 1, :KS[level + 1]],
                                                 0.2 * phi / phi.mean(), bank.parents[level, labels[level]])
        rate, expected = kept[level].double().mean().item(), probability.double().mean().item()
        assert rate == pytest.approx(expected, abs=0.01)
    again = term.kept(bank, z, labels, index, views=200, epoch=1)
    assert all(torch.equal(a, b) for a, b in zip(kept[:2], again[:2]))
    assert not torch.equal(kept[0], term.kept(bank, z, labels, index, views=200, epoch=2)[0])
    independent = _bank(3, nested=False)
    assert term.kept(independent, z, labels, index, views=200, epoch=1) == [None, None, None]


def test_the_zero_treatment_keeps_a_flagged_logit_of_zero_in_the_denominator():
    """treatment='zero' (HCSC's code: a dropped negative's logit multiplied by 0) against the
    direct sum; never an excluded column, and no gradient through the zeroed logits."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 5, generator=gen, dtype=torch.float64).requires_grad_()
    positive = torch.tensor([1, 2, 0])
    excluded = torch.zeros(3, 5, dtype=torch.bool)
    excluded[0, 4] = True
    flags = torch.zeros(1, 3, 5, dtype=torch.bool)
    flags[0, 0, 3] = flags[0, 0, 4] = flags[0, 2, 1] = True
    loss = masked_nce(logits, positive, excluded, flags.clone(), 'zero')
    for a in range(3):
        terms = [0.0 if flags[0, a, c] and not excluded[a, c] else float(logits[a, c])
                 for c in range(5) if not excluded[a, c]]
        assert loss[a].item() == pytest.approx(math.log(sum(math.exp(x) for x in terms)) - float(logits[a, positive[a]]))
    loss.sum().backward()
    assert logits.grad[0, 3] == 0 and logits.grad[2, 1] == 0


def _hcsc(**options):
    torch.manual_seed(0)
    return MODELS.build(dict(type='HCSC', backbone=TINY_BACKBONE, neck=TINY_NECK, **options))


def test_the_presets_options_name_the_authors_choices():
    model = _hcsc(dropped='zeroed', level_loss='sum')
    assert model.treatment == 'zero' and model.level_loss == 'sum' and model.prototype_term.zeroed
    assert model.round_outputs == {'labels', 'centroids', 'concentrations'}
    assert _hcsc().treatment == 'elim' and _hcsc(prototypes=False).prototype_term is None
    with pytest.raises(ValueError, match="^HCSC dropped must be one of 'removed', 'zeroed', got 'kept'"):
        _hcsc(dropped='kept')
    with pytest.raises(ValueError, match="^HCSC level_loss must be one of 'mean', 'sum'"):
        _hcsc(level_loss='max')
    with pytest.raises(ValueError, match="HCSC's dropped= sets its treatment"):
        _hcsc(treatment='attr')


def test_level_loss_sum_is_the_levels_sum_and_the_prototype_term_is_added():
    """On the same weights and batch: the instance loss summed over the 3 levels is 3 times their
    mean; the prototype term is logged as loss_proto."""
    from ifnd.models.false_negatives import PseudoLabelBank  # noqa: F401  (the real bank)
    gen = torch.Generator().manual_seed(6)
    models = [_hcsc(level_loss=kind) for kind in ('mean', 'sum')]
    labels = torch.stack([torch.randint(0, k, (NUM_SAMPLES, ), generator=gen) for k in KS])
    centroids = F.normalize(torch.randn(3, max(KS), TINY_NECK['out_dim'], generator=gen), dim=-1)
    for model in models:
        model.label_bank.reset(3, NUM_SAMPLES)
        model.label_bank.update(labels, centroids, 0.1 + torch.rand(3, max(KS), generator=torch.Generator().manual_seed(7)), KS)
        model.detector.setup(NUM_SAMPLES, 10, torch.device('cpu'))
        model.detector.set_epoch(2)
        model.eval()
    views = [torch.rand(6, 3, 16, 16, generator=gen) for _ in range(2)]
    samples = {'index': torch.randperm(NUM_SAMPLES, generator=gen)[:6]}
    mean, total = (m.loss(views, samples) for m in models)
    torch.testing.assert_close(total['loss'], 3 * mean['loss'])
    assert mean['loss_proto'] > 0 and torch.equal(mean['loss_proto'], total['loss_proto'])


def test_no_round_in_the_warm_up_and_a_resume_inside_it_waits_for_its_end(tmp_path):
    """HCSC's warm-up: with warmup_epochs=2 and interval 1 the rounds follow epochs 2 and 3 only,
    the loss has no prototype term before; a run resumed after epoch 1 clusters first after epoch 2
    and ends with the uninterrupted run's labels."""
    import json

    import numpy as np
    from helpers import digits_config, train_tool

    def run(work_dir, max_epochs):
        cfg = digits_config(str(work_dir), dict(type='HCSC', dropped='zeroed', level_loss='sum'),
                            max_epochs=max_epochs,
                            pseudo_labels=dict(num_clusters=[8, 4], hierarchy='nested', warmup_epochs=2,
                                               interval=1, score='pcl', kmeans=dict(nredo=1, niter=5),
                                               acceptance=dict(type='ConstantAcceptance', final_rate=1.0)))
        cfg.train_dataloader.dataset.subset_fraction = 0.1
        cfg.randomness = dict(seed=0, deterministic=True)
        path = str(tmp_path / f'{work_dir.name}.py')
        cfg.dump(path)
        train_tool.main([path])

    run(tmp_path / 'whole', 3)
    rounds = json.loads((tmp_path / 'whole' / 'pseudo_labels' / 'rounds.json').read_text())
    assert [r['epoch'] for r in rounds] == [2, 3] and rounds[0]['hierarchy'] == 'nested'
    run(tmp_path / 'resumed', 1)
    assert not (tmp_path / 'resumed' / 'pseudo_labels').exists()  # no round in the warm-up
    cfg_path = tmp_path / 'resumed.py'
    cfg_path.write_text(cfg_path.read_text().replace('max_epochs=1', 'max_epochs=3'))
    train_tool.main([str(cfg_path), '--resume'])
    for epoch in (2, 3):
        name = f'epoch_{epoch:04d}.npz'
        whole, resumed = (np.load(tmp_path / d / 'pseudo_labels' / name) for d in ('whole', 'resumed'))
        assert np.array_equal(whole['labels'], resumed['labels'])
