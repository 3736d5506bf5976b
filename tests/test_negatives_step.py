"""The one negatives step under every base: NNCLR's loss against a float64 reference, its support set
and neighbours, MoCo's queued keys counted against their classes, the parts declaring what they
need of a clustering round, the weightings as registered parts, and docs/methods.md's "Adding a
base" example trained with IFND's pseudo labels."""
import os.path as osp
import types

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_BACKBONE, TINY_NECK
from loss_references import masked_info_nce
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope

from ifnd.models.false_negatives.detector import false_negative_detection_counts
from ifnd.models.false_negatives.treatment import Debiased, HardNegatives, build_weighting
from ifnd.registry import HOOKS, MODELS

NUM_IMAGES, NUM_SAMPLES, DIM = 6, 40, 8
NNCLR = dict(type='NNCLR', temperature=0.3, support_size=32,
             predictor=dict(type='MLPNeck', hidden_dim=16))


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _build(**cfg) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS.build(dict(dict(NNCLR, backbone=TINY_BACKBONE, neck=TINY_NECK), **cfg))


def nnclr_reference(neighbours: torch.Tensor, predictions: torch.Tensor, tau: float,
                    flags: torch.Tensor | None = None, treatment: str | None = None) -> torch.Tensor:
    """NNCLR's symmetric loss from the paper, anchor by anchor: ½ [CE(NN(z1)·p2ᵀ/τ) +
    CE(NN(z2)·p1ᵀ/τ)] over the M images; ``flags`` ``[L, 2M, 2M]`` (columns: ``cat([p1, p2])``) of
    the other view's predictions eliminated from the denominator or attracted, the levels averaged."""
    num = neighbours.shape[0] // 2
    levels = [None] if flags is None else list(flags)
    total = neighbours.new_zeros(())
    for level in levels:
        for view in range(2):
            other = slice(num, 2 * num) if view == 0 else slice(0, num)
            for i in range(num):
                anchor = view * num + i
                logits = (neighbours[anchor] @ predictions[other].t() / tau).unsqueeze(0)
                flagged = torch.zeros(1, num, dtype=torch.bool) if level is None else \
                    level[anchor, other].unsqueeze(0).clone()
                flagged[0, i] = False  # the own image's prediction is the positive, never flagged
                positive = F.one_hot(torch.tensor([i]), num).bool()
                if treatment == 'attr':
                    loss = masked_info_nce(logits, positive | flagged, torch.ones_like(positive))
                else:
                    loss = masked_info_nce(logits, positive, ~flagged if treatment == 'elim' else
                                           torch.ones_like(positive))
                total = total + loss[0]
    return total / (2 * num * len(levels))


@pytest.mark.parametrize('treatment', [None, 'elim', 'attr'])
def test_nnclr_loss_and_gradients_match_a_float64_reference(treatment):
    """The step's loss on NNCLR's layout, in float64 on random unit vectors, with IFND's pseudo
    labels flagging the other view's predictions."""
    gen = torch.Generator().manual_seed(1)
    detector = {} if treatment is None else dict(detector=dict(type='PseudoLabels'), treatment=treatment)
    model = _build(**detector).double()
    neighbours = F.normalize(torch.randn(2 * NUM_IMAGES, DIM, dtype=torch.float64, generator=gen), dim=1)
    predictions = F.normalize(torch.randn(2 * NUM_IMAGES, DIM, dtype=torch.float64, generator=gen),
                              dim=1).requires_grad_()
    index = torch.randperm(NUM_SAMPLES, generator=gen)[:NUM_IMAGES]
    flags = None
    if treatment is not None:
        labels = torch.randint(0, 2, (2, NUM_SAMPLES), generator=gen)  # two levels, accepted
        model.label_bank.reset(2, NUM_SAMPLES)
        model.label_bank.update(labels)
        image = labels[:, index.repeat(2)]
        flags = image.unsqueeze(2) == image.unsqueeze(1)  # [L, 2M, 2M]
    loss = model.head_losses(neighbours, predictions, {'index': index})['loss']
    expected = nnclr_reference(neighbours, predictions.detach().requires_grad_(), model.temperature,
                               flags, treatment)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    mine, = torch.autograd.grad(loss, predictions)
    reference = predictions.detach().requires_grad_()
    theirs, = torch.autograd.grad(nnclr_reference(neighbours, reference, model.temperature, flags,
                                                  treatment), reference)
    torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)


def test_nnclr_takes_the_nearest_queued_projection_and_queues_the_first_views():
    """NN(z, Q) is the support row of the highest cosine (brute force); after a step the first
    views' projections are the newest rows, the oldest gone; the neighbours carry no gradient."""
    model = _build().train()
    gen = torch.Generator().manual_seed(2)
    z = F.normalize(torch.randn(5, TINY_NECK['out_dim'], generator=gen), dim=1)
    best = [max(range(len(model.support)), key=lambda j: float(z[i] @ model.support[j]))
            for i in range(len(z))]
    assert torch.equal(model.neighbours(z), model.support[best])
    before = model.support.clone()
    views = [torch.rand(NUM_IMAGES, 3, 16, 16, generator=gen) for _ in range(2)]
    seen = {}
    heads = model.heads
    model.heads = lambda features: seen.setdefault('zp', heads(features))
    model.loss(views, {'index': torch.arange(NUM_IMAGES)})['loss'].backward()
    z1 = seen['zp'][0][:NUM_IMAGES].detach()
    torch.testing.assert_close(model.support[:NUM_IMAGES], z1, rtol=0, atol=0)
    torch.testing.assert_close(model.support[NUM_IMAGES:], before[NUM_IMAGES:], rtol=0, atol=0)
    assert int(model.support_ptr) == NUM_IMAGES
    assert model.support.grad is None and not model.support.requires_grad


def test_the_recipe_config_has_the_authors_numbers():
    """configs/nnclr/nnclr_r50_1000e_in1k.py: Dwibedi et al.'s Sec. 4.1, as built."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(osp.dirname(__file__), '..', 'configs', 'nnclr',
                                   'nnclr_r50_1000e_in1k.py'))
    model = cfg.model
    assert (model.type, model.support_size, model.temperature) == ('NNCLR', 98304, 0.1)
    assert (model.neck.hidden_dim, model.neck.out_dim, model.neck.num_layers) == (2048, 256, 3)
    assert model.neck.with_last_bn and not model.predictor.with_last_bn
    assert (model.predictor.hidden_dim, model.predictor.num_layers) == (4096, 2)
    assert cfg.optim_wrapper.optimizer.type == 'LARS' and cfg.optim_wrapper.optimizer.lr == 0.3
    assert cfg.optim_wrapper.optimizer.weight_decay == 1e-6 and cfg.train_cfg.max_epochs == 1000
    assert cfg.auto_scale_lr.base_batch_size == 256  # lr 0.3 x batch / 256: 4.8 at 4096


def test_moco_counts_its_queued_keys_against_their_classes():
    """IFNDMoCo's detection counts over (query, queued key) pairs equal a brute-force count, the
    queue's unknown rows (index and class -1) left out; the keys enqueued carry their classes."""
    torch.manual_seed(0)
    model = MODELS.build(dict(type='IFNDMoCo', temperature=0.2, queue_len=16, bn_splits=2,
                              backbone=TINY_BACKBONE, neck=TINY_NECK))
    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 3, (2, NUM_SAMPLES), generator=gen)
    classes = torch.randint(0, 3, (NUM_SAMPLES, ), generator=gen)
    model.label_bank.reset(2, NUM_SAMPLES)
    model.label_bank.update(labels)
    known = torch.arange(16) < 12  # four rows still the initial random ones
    model.queue_index.copy_(torch.where(known, torch.randint(0, NUM_SAMPLES, (16, ), generator=gen), -1))
    model.queue_label.copy_(torch.where(known, classes[model.queue_index.clamp(min=0)], -1))
    queue_index, queue_label = model.queue_index.clone(), model.queue_label.clone()
    index = torch.randperm(NUM_SAMPLES, generator=gen)[:4]
    model.track_detection = True
    model.loss([torch.rand(4, 3, 16, 16, generator=gen) for _ in range(2)],
               {'index': index, 'label': classes[index]})
    expected = torch.zeros(2, 3, dtype=torch.float64)
    for level in range(2):
        for m in range(4):
            for j in range(16):
                if queue_label[j] < 0:
                    continue
                flagged = bool(queue_index[j] >= 0 and labels[level, queue_index[j]] == labels[level, index[m]])
                same = bool(queue_label[j] == classes[index[m]])
                expected[level] += torch.tensor([flagged, flagged and same, same], dtype=torch.float64)
    torch.testing.assert_close(model.detection_counts, expected, rtol=0, atol=0)
    assert expected[:, 0].sum() > 0 and expected[:, 2].sum() > 0
    # The step's keys are queued with their classes (rows 0 to 3 of the ring).
    assert torch.equal(model.queue_label[:4], classes[index])
    assert torch.equal(model.queue_index[:4], index)


def test_an_old_checkpoint_without_the_queues_classes_loads_them_as_unknown():
    model = MODELS.build(dict(type='MoCoV2', queue_len=8, backbone=TINY_BACKBONE, neck=TINY_NECK))
    state = {k: v for k, v in model.state_dict().items() if k != 'queue_label'}
    model.queue_label.fill_(3)
    model.load_state_dict(state)
    assert model.queue_label.tolist() == [-1] * 8


def test_the_counts_leave_out_pairs_of_unknown_class():
    """The counting the step runs, on a hand-made case: one unknown candidate class, two levels."""
    flags = torch.tensor([[[True, True, False]], [[False, True, True]]])
    counts = false_negative_detection_counts(flags, torch.ones(1, 3, dtype=torch.bool),
                                             torch.tensor([1]), torch.tensor([1, -1, 2]), levels=2)
    assert counts.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]


def _round(model, score: str) -> None:
    hook = HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[3, 5], score=score,
                            acceptance=dict(type='ConstantAcceptance', final_rate=1.0),
                            dataset=dict(type='Digits', split='train', subset_fraction=0.05),
                            pipeline=dict(type='EvalView', size=16), batch_size=32, num_workers=0,
                            kmeans=dict(niter=5, nredo=1), save_labels=False))
    runner = types.SimpleNamespace(
        model=model, max_epochs=10, work_dir='.', logger=MMLogger.get_instance('step-test'),
        visualizer=types.SimpleNamespace(add_scalars=lambda *args, **kwargs: None))
    model.label_bank.reset(2, 68)
    hook.run_round(runner, 1)
    return hook


@pytest.mark.parametrize('score', ['kappa', 'pcl'])
def test_a_round_computes_what_the_parts_declare(score):
    """HCSC's selection declares PCL's concentrations: the round computes them whatever the
    acceptance ranks by; IFND's pseudo labels declare none, so ranking by κ computes no φ."""
    torch.manual_seed(0)
    hcsc = MODELS.build(dict(type='HCSC', backbone=TINY_BACKBONE, neck=TINY_NECK))
    ifnd = MODELS.build(dict(type='IFND', backbone=TINY_BACKBONE, neck=TINY_NECK))
    assert hcsc.round_outputs == {'labels', 'centroids', 'concentrations'}
    assert ifnd.round_outputs == {'labels'}
    hook = _round(hcsc, score)
    assert 'concentrations' in hook.round_outputs(hcsc)
    assert hcsc.label_bank.concentration.std() > 0  # PCL's φ, per prototype
    _round(ifnd, score)
    assert (ifnd.label_bank.concentration.std() > 0) == (score == 'pcl')


def test_weightings_are_registered_parts_that_check_their_own_settings():
    assert isinstance(MODELS.build(dict(type='debiased', tau_plus=0.1)), Debiased)
    hard = build_weighting(dict(type='hard', tau_plus=0.1, beta=2.0), 'SimCLR')
    assert isinstance(hard, HardNegatives) and (hard.tau_plus, hard.beta) == (0.1, 2.0)
    with pytest.raises(ValueError, match="^SimCLR weighting 'hard' needs beta > 0"):
        build_weighting(dict(type='hard', beta=0.0), 'SimCLR')
    with pytest.raises(ValueError, match=r"^SimCLR weighting 'debiased' takes tau_plus, not beta"):
        build_weighting(dict(type='debiased', beta=1.0), 'SimCLR')
    with pytest.raises(ValueError, match=r'^SimCLR weighting tau_plus must be a float in \[0, 1\)'):
        build_weighting(dict(type='debiased', tau_plus=1.5), 'SimCLR')


def test_the_documented_base_trains_ifnd_and_is_counted():
    """docs/methods.md's "Adding a base", as written: with IFND's pseudo labels it is elimination
    on MoCo v3's layout (the reference below), and its flags are counted."""
    text = open(osp.join(osp.dirname(__file__), '..', 'docs', 'methods.md')).read()
    code = text.split('## Adding a base', 1)[1].split('```python\n', 1)[1].split('```', 1)[0]
    MODELS._module_dict.pop('CrossViewCLR', None)
    try:
        exec(compile(code, 'docs/methods.md', 'exec'), {})
        torch.manual_seed(0)
        model = MODELS.build(dict(type='CrossViewCLR', backbone=TINY_BACKBONE, neck=TINY_NECK,
                                  temperature=0.2, detector=dict(type='PseudoLabels'), treatment='elim'))
        model.eval()  # BN normalising each sample alone: the embeddings below are the loss's
        gen = torch.Generator().manual_seed(4)
        labels = torch.randint(0, 2, (1, NUM_SAMPLES), generator=gen)
        model.label_bank.reset(1, NUM_SAMPLES)
        model.label_bank.update(labels)
        model.track_detection = True
        views = [torch.rand(NUM_IMAGES, 3, 16, 16, generator=gen) for _ in range(2)]
        index = torch.randperm(NUM_SAMPLES, generator=gen)[:NUM_IMAGES]
        loss = model.loss(views, {'index': index, 'label': index % 2})['loss']
        with torch.no_grad():
            z = model.embed(torch.cat(views)).double()
        image = labels[:, index.repeat(2)]
        flags = image.unsqueeze(2) == image.unsqueeze(1)
        # Its layout is NNCLR's with the embeddings on both sides: the same reference applies.
        torch.testing.assert_close(loss.double(), nnclr_reference(z, z, 0.2, flags, 'elim'),
                                   rtol=1e-5, atol=1e-6)
        assert model.detection_counts is not None and model.detection_counts[0, 0] > 0
    finally:
        MODELS._module_dict.pop('CrossViewCLR', None)


MOCO_CONFIGS = ['ifnd_r50_200e_in1k.py', 'hcsc/hcsc_mocov2_r50_200e_in1k.py', 'mocov2/mocov2_r50_200e_in1k.py',
                'mocov3/mocov3_r50_100e_in1k.py', 'mocov3/mocov3_vit-small-p16_300e_in1k.py',
                'ifnd/ifnd_mocov3_r50_100e_in1k.py', 'ifnd/ifnd_mocov3_vit-tiny-p4_200e_fmnist.py',
                'nnclr/nnclr_r50_1000e_in1k.py']


@pytest.mark.parametrize('config', MOCO_CONFIGS)
def test_the_detection_hook_runs_on_the_imagenet_recipes(config):
    """FalseNegativeDetectionHook on the headline recipe (IFND on MoCo v2), HCSC's, and the MoCo v3
    and NNCLR ones, at toy size: two steps' flags counted against the classes, precision and recall
    logged for the epoch, the configs' hooks kept."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(osp.dirname(__file__), '..', 'configs', config))
    hooks = [h['type'] for h in cfg.custom_hooks]
    assert ('FalseNegativeDetectionHook' in hooks) == (cfg.model.type in ('IFNDMoCo', 'HCSCMoCo', 'IFNDMoCoV3'))
    vit = cfg.model.backbone.type == 'ViTBackbone'
    backbone = dict(type='ViTBackbone', img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2) \
        if vit else TINY_BACKBONE
    small = dict(neck=dict(cfg.model.neck, hidden_dim=32, out_dim=16), backbone=backbone)
    for key, value in (('queue_len', 16), ('bn_splits', 2), ('support_size', 16)):
        if key in cfg.model:
            small[key] = value
    if 'predictor' in cfg.model:
        small['predictor'] = dict(cfg.model.predictor, hidden_dim=32, out_dim=16)
    model_cfg = dict(cfg.model.to_dict(), **small)
    model_cfg.pop('data_preprocessor')
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    if hasattr(model, 'set_progress'):
        model.set_progress(0, 10)
    if getattr(model, 'label_bank', None) is not None:
        model.label_bank.reset(3, NUM_SAMPLES)
        labels = torch.randint(0, 3, (3, NUM_SAMPLES), generator=torch.Generator().manual_seed(5))
        centroids = F.normalize(torch.randn(3, 3, 16), dim=2)
        model.label_bank.update(labels, centroids, torch.full((3, 3), 0.2), [3, 3, 3])
        model.detector.setup(NUM_SAMPLES, 10, torch.device('cpu'))
        model.detector.set_epoch(5)
    logged = []
    runner = types.SimpleNamespace(
        epoch=0, logger=MMLogger.get_instance('fn-recipes'), model=model,
        visualizer=types.SimpleNamespace(add_scalars=lambda s, step: logged.append(s)))
    hook = HOOKS.build(dict(type='FalseNegativeDetectionHook'))
    hook.before_train(runner)
    hook.before_train_epoch(runner)
    gen = torch.Generator().manual_seed(6)
    for step in range(2):  # MoCo v2: the second step's queue holds the first's labelled keys
        index = torch.arange(8) + 8 * step
        views = [torch.rand(8, 3, 16, 16, generator=gen) for _ in range(2)]
        model.loss(views, {'index': index, 'label': index % 2})
    hook.after_train_epoch(runner)
    (scalars, ) = logged
    assert 0 <= scalars['train/fn_recall'] <= 100
    if model.detector is not None:  # a detector flags some of the negatives
        assert 0 <= scalars['train/fn_precision'] <= 100 and scalars['train/fn_recall'] > 0
