"""The GPU recipes' training step on the CPU: the encoder compiled by inductor, bfloat16 autocast.

Where CUDA is present the recipes compile the encoder (``TimmBackbone(compile='auto')``) and train
in bfloat16 (``AutoAmpOptimWrapper``). Here the same code runs on the CPU with ``compile=True``
(inductor, the default backend: it generates and builds C++ kernels with gcc) and with
``AutoAmpOptimWrapper(bf16_on_cpu=True)``.
"""
import copy
import dataclasses
from collections import defaultdict

import pytest
import torch
import torch._dynamo
from helpers import TINY_BACKBONE, TINY_NECK, digits_config
from mmengine.hooks import Hook
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import ifnd.clustering.round as clustering_round
import ifnd.models.contrastive as contrastive
from ifnd.engine import features
from ifnd.engine.optim import CPUBfloat16OptimWrapper
from ifnd.registry import MODELS, RUNNERS

# The smallest network with every part the recipes compile (ResNet blocks with downsampling
# shortcuts, BN, channels_last); inductor's compile time on two cores grows with the layers.
BACKBONE = dict(TINY_BACKBONE, layers=(1, 1, 1, 1), channels_last=True)
# Per algorithm: the model and its training batch. Both encoders see 16 images (IFND's 2 x 8
# views, IFNDMoCo's 16 queries), so inductor's on-disk cache serves the second query graph.
ALGORITHMS = {
    'IFND': (dict(type='IFND', temperature=0.5), 8),
    'IFNDMoCo': (dict(type='IFNDMoCo', temperature=0.2, queue_len=64,
                      momentum=0.99, bn_splits=2), 16),
}
# Feature extraction batch: 40 training images give 12 + 12 + 12 + 4, a smaller last batch, and a
# size other than the training batch (where automatic dynamic shapes would turn a graph dynamic).
EXTRACT_BATCH = 12
SUBSET = 0.03  # of digits' 1347 training images: 40, balanced over the classes
LOW_PRECISION = {torch.bfloat16, torch.float16}


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _frames() -> int:
    """Frames dynamo has compiled so far (a recompile counts again)."""
    return counters['frames']['ok']


class CompileMarks(Hook):
    """Dynamo's compiled-frame count after each training step and each epoch's end hooks."""

    priority = 'LOWEST'  # after PseudoLabelHook's round at the epoch's end

    def __init__(self) -> None:
        self.marks: list[tuple[str, int]] = []

    def before_train(self, runner) -> None:
        self.marks.append((f'start, epoch {runner.epoch}', _frames()))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.marks.append((f'iteration {runner.iter}', _frames()))

    def after_train_epoch(self, runner) -> None:
        self.marks.append((f'end of epoch {runner.epoch + 1}', _frames()))


def _config(work_dir: str, name: str, max_epochs: int, **overrides):
    model, batch = ALGORITHMS[name]
    cfg = digits_config(work_dir, copy.deepcopy(model), max_epochs=max_epochs, batch_size=batch,
                        pseudo_labels=dict(num_clusters=[4], interval=1,
                                           kmeans=dict(nredo=1, niter=5)), **overrides)
    cfg.model.backbone = dict(BACKBONE, compile=True)
    cfg.train_dataloader.dataset.subset_fraction = SUBSET
    cfg.custom_hooks[0].batch_size = EXTRACT_BATCH
    return cfg


def _train(cfg) -> tuple[object, CompileMarks]:
    runner = RUNNERS.build(cfg)
    marks = CompileMarks()
    runner.register_hook(marks)
    runner.train()
    return runner, marks


@pytest.fixture(scope='module', params=list(ALGORITHMS))
def compiled_run(request, tmp_path_factory):
    """A real short run of the compiled recipe (2 epochs, a clustering round before and after
    each), then a resumed run for a third epoch, with every graph inductor compiled."""
    name = request.param
    work_dir = str(tmp_path_factory.mktemp(name))
    torch._dynamo.reset()  # graphs of other tests would count against the recompile limit
    counters.clear()
    graphs = []  # per graph inductor compiled: whether its shapes are all static
    from torch._inductor import compile_fx as inductor
    original = inductor.compile_fx

    def recording_compile_fx(gm, example_inputs, *args, **kwargs):
        graphs.append(all(isinstance(x, int) or isinstance(x, torch.Tensor) and all(
            isinstance(d, int) for d in x.shape) for x in example_inputs))  # no SymInt
        return original(gm, example_inputs, *args, **kwargs)

    inductor.compile_fx = recording_compile_fx
    try:
        torch.manual_seed(0)
        _, marks = _train(_config(work_dir, name, max_epochs=2))
        resumed, resumed_marks = _train(_config(work_dir, name, max_epochs=3, resume=True))
        yield dict(name=name, marks=marks.marks, resumed=resumed, resumed_marks=resumed_marks.marks,
                   graphs=graphs, graph_breaks=dict(counters['graph_break']),
                   unique_graphs=counters['stats']['unique_graphs'])
    finally:
        inductor.compile_fx = original
        torch._dynamo.reset()


def test_compiled_recipe_compiles_each_mode_once_with_inductor(compiled_run):
    """One static graph per mode, built by inductor, and no recompile afterwards: not from step
    to step, at an epoch's end, in the clustering rounds' extraction with its smaller last batch,
    nor in the resumed run (a fresh model loaded from the checkpoint)."""
    # Modes: extraction (eval), the encoder's training step, and the projection head with the loss;
    # IFNDMoCo's key encoder (split BN, no gradient) is a fourth. The head and loss compile once
    # more at the first step with accepted pseudo labels, whose masks then join their graph.
    modes = 3 if compiled_run['name'] == 'IFND' else 4
    marks, resumed = compiled_run['marks'], compiled_run['resumed_marks']
    assert marks[0] == ('start, epoch 0', 1)  # the first clustering round compiled extraction
    assert marks[1] == ('iteration 0', modes)  # the first step compiled the rest
    counts = [n for _, n in marks + resumed]
    accepted = counts.index(modes + 1)  # the first step of epoch 2 (epoch 1 accepts nothing)
    assert marks[accepted][0] == f'iteration {len(compiled_run["resumed"].train_dataloader)}'
    assert counts == [1] + [modes] * (accepted - 1) + [modes + 1] * (len(counts) - accepted), marks
    steps = len(compiled_run['resumed'].train_dataloader)
    assert len(resumed) == 1 + steps + 1  # its start, one epoch's steps and its end
    # Each frame is one graph (a graph break would split it) and went through inductor, with
    # static shapes (see TimmBackbone's compile options).
    assert compiled_run['graph_breaks'] == {}
    assert compiled_run['unique_graphs'] == modes + 1
    assert compiled_run['graphs'] == [True] * (modes + 1)


def _fresh_pair(run) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The compiled recipe's model and an uncompiled one, both with the resumed run's weights."""
    cfg = copy.deepcopy(run['resumed'].cfg.model)
    compiled = MODELS.build(cfg)
    eager = MODELS.build(dict(cfg, backbone=dict(cfg.backbone, compile=False)))
    state = run['resumed'].model.state_dict()
    for model in (compiled, eager):
        model.load_state_dict(state)
    return compiled, eager


def _in_float64(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` computing in float64, its embeddings included (which the models cast to float32)."""
    model.double()
    model.project = lambda f: torch.nn.functional.normalize(model.neck(f), dim=1)
    if hasattr(model, '_key_embed'):
        model._key_embed = lambda x: torch.nn.functional.normalize(
            model.momentum_neck(model.momentum_backbone(x)), dim=1)
    return model


def test_compiled_step_and_extraction_equal_the_uncompiled_ones(compiled_run):
    """Loss, gradients and buffers (BN statistics, the queue) of a step, and extracted features."""
    runner = compiled_run['resumed']
    # After three epochs every pseudo label is accepted: the elimination masks are in use.
    assert bool((runner.model.label_bank.labels >= 0).all())
    compiled, eager = _fresh_pair(compiled_run)
    reference = _in_float64(_fresh_pair(compiled_run)[1])
    batch = next(iter(runner.train_dataloader))
    frames = _frames()
    results = []
    for model in (compiled, eager, reference):
        torch.manual_seed(0)  # the same key shuffle
        data = model.data_preprocessor(batch, True)
        if model is reference:
            data['inputs'] = [x.double() for x in data['inputs']]
        loss = model(**data, mode='loss')['loss']
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads, model.state_dict()))
    assert _frames() == frames  # the fresh compiled model ran the graphs already compiled
    (loss, grads, state), (eager_loss, _, eager_state), (ref_loss, ref_grads, _) = results
    # Inductor fuses and reorders the float32 sums (BN statistics, reductions), which moves results
    # by a few ulps per layer, as the eager float32 kernels' own order does: both are compared with
    # the step in float64. Measured here (one thread): the loss within 3e-7; each gradient within
    # 8e-6 of its norm compiled, 5e-4 eager (an early BN bias whose sum nearly cancels). 1e-5 and
    # 1e-4 leave margin for other CPUs' kernels and are far below what a wrong graph (a missed BN
    # update, a stale weight, a queue read after its enqueue) gives.
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        error = (grad.double() - ref_grads[name]).norm() / ref_grads[name].norm().clamp(min=1e-12)
        assert error < 1e-4, (name, float(error))
    for name, value in state.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, eager_state[name], rtol=1e-4, atol=1e-5, msg=name)
        else:
            assert torch.equal(value, eager_state[name]), name
    dataset = features.build_eval_dataset(runner.cfg.train_dataloader.dataset,
                                          dict(type='EvalView', size=16))
    feats = [features.extract_features(model, dataset, batch_size=EXTRACT_BATCH, num_workers=0)[0]
             for model in (compiled, eager)]
    torch.testing.assert_close(feats[0], feats[1], rtol=1e-4, atol=1e-5)
    assert _frames() == frames


class FloatInputs(TorchDispatchMode):
    """Records, per op, the floating dtypes of its tensor inputs (forward ops only here)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set] = defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for x in tree_leaves((args, kwargs or {})):
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                self.seen[func._schema.name].add(x.dtype)
        return func(*args, **(kwargs or {}))


def _tensors(out) -> list[torch.Tensor]:
    """The tensors in ``out``, also inside dataclasses (``KMeansResult``), which pytree leaves whole."""
    found = []
    for x in tree_leaves(out):
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            found += _tensors([getattr(x, f.name) for f in dataclasses.fields(x)])
    return found


def _spy(monkeypatch, owner, name: str, seen: dict) -> None:
    """Run ``owner.name`` (or ``owner[name]`` for a table) under :class:`FloatInputs`, adding what
    its ops read to ``seen``, and its output's dtype as ``'output'``."""
    table = isinstance(owner, dict)
    original = owner[name] if table else getattr(owner, name)

    def spied(*args, **kwargs):
        with FloatInputs() as ops:
            out = original(*args, **kwargs)
        for op, dtypes in ops.seen.items():
            seen[op] |= dtypes
        for x in _tensors(out):
            if x.is_floating_point():
                seen['output'].add(x.dtype)
        return out

    if table:
        monkeypatch.setitem(owner, name, spied)
    else:
        monkeypatch.setattr(owner, name, spied)


def _low_precision(seen: dict) -> dict:
    return {op: dtypes for op, dtypes in seen.items() if dtypes & LOW_PRECISION}


def _record_output_dtypes(module: torch.nn.Module, into: set) -> None:
    module.register_forward_hook(lambda mod, args, out: into.add(out.dtype))


def _bank_with_labels(model, num: int) -> None:
    """Every other sample accepted, into 3 clusters: the elimination masks are in use."""
    model.label_bank.reset(1, num)
    labels = model.label_bank.labels.clone()
    labels[0, ::2] = torch.arange(num // 2) % 3
    model.label_bank.update(labels)


@pytest.mark.parametrize('name', list(ALGORITHMS))
def test_bf16_step_keeps_similarities_logsumexp_and_queue_in_float32(name, monkeypatch):
    """The recipe's autocast really casts the encoder to bfloat16, while the loss (similarities,
    log-sum-exp) and the MoCo queue stay float32; the loss stays near the float32 one."""
    model_cfg, batch = ALGORITHMS[name]
    torch.manual_seed(0)
    # Uncompiled: what reaches the loss does not depend on compiling the network (inductor
    # keeps each op's dtype), and a bfloat16 graph would cost another compile.
    bf16 = MODELS.build(dict(model_cfg, backbone=BACKBONE, neck=TINY_NECK))
    _bank_with_labels(bf16, 4 * batch)
    fp32 = copy.deepcopy(bf16)
    optim = dict(type='AutoAmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1))
    bf16_wrapper = build_optim_wrapper(bf16, dict(optim, bf16_on_cpu=True))
    fp32_wrapper = build_optim_wrapper(fp32, optim)  # float32 on a CPU, the recipe's default
    assert isinstance(bf16_wrapper, CPUBfloat16OptimWrapper)
    assert not isinstance(fp32_wrapper, CPUBfloat16OptimWrapper)

    encoder, in_loss, enqueued = set(), defaultdict(set), set()
    _record_output_dtypes(bf16.backbone.model.layer4, encoder)
    # The similarities and the loss over them (the negatives step's contrast): float32 only.
    _spy(monkeypatch, contrastive, 'contrast', in_loss)
    if name == 'IFNDMoCo':
        _record_output_dtypes(bf16.momentum_backbone.model.layer4, encoder)
        enqueue = bf16._enqueue
        monkeypatch.setattr(bf16, '_enqueue',
                            lambda keys, *rest: enqueued.add(keys.dtype) or enqueue(keys, *rest))

    g = torch.Generator().manual_seed(0)
    for step in range(2):  # IFNDMoCo: the second step's queue holds labelled keys
        data = {'inputs': [torch.rand(batch, 3, 16, 16, generator=g) for _ in range(2)],
                'index': torch.arange(batch) + step * batch}
        fp32.load_state_dict(bf16.state_dict())  # the same weights, queue and labels
        losses = []
        for model, wrapper in ((bf16, bf16_wrapper), (fp32, fp32_wrapper)):
            torch.manual_seed(step)  # the same key shuffle
            losses.append(model.train_step(copy.deepcopy(data), wrapper)['loss'].detach())
        # bfloat16 keeps 8 significant bits (a relative rounding error up to 2^-9 = 0.2% per op);
        # through the encoder's ~10 layers the loss (2 to 4 here) moves by up to about 0.5%, so
        # 1% holds with margin. A bfloat16 loss would also pass this bound at this size: the
        # dtype checks (of the loss and of every op inside it, below) are what catch a leak.
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-2, atol=0)
        assert losses[0].dtype == torch.float32

    assert encoder == {torch.bfloat16}  # autocast really ran the encoder in bfloat16
    # The similarities and the log-sum-exp ('elim' masks it) were seen, all in float32.
    assert {'aten::mm', 'aten::logsumexp'} <= in_loss.keys(), in_loss.keys()
    assert _low_precision(in_loss) == {}, 'bfloat16 reached the loss'
    if name == 'IFNDMoCo':
        assert enqueued == {torch.float32} and bf16.queue.dtype == torch.float32


def test_bf16_recipe_clusters_and_scores_in_float32(tmp_path, monkeypatch):
    """A short run with the recipe's bfloat16 autocast on the CPU, for training and for the
    clustering rounds' extraction (as the hook's ``autocast=True`` does on CUDA): k-means and κ
    get float32 features and compute in float32."""
    monkeypatch.setattr(features, '_autocast', lambda device, enabled: torch.autocast(
        'cpu', dtype=torch.bfloat16, enabled=enabled))
    kmeans, kappa = defaultdict(set), defaultdict(set)
    _spy(monkeypatch, clustering_round.HIERARCHIES, 'independent', kmeans)
    _spy(monkeypatch, clustering_round, 'confidence', kappa)
    cfg = _config(str(tmp_path), 'IFNDMoCo', max_epochs=1)
    cfg.model.backbone = BACKBONE  # uncompiled, as in the step test above
    cfg.optim_wrapper = dict(type='AutoAmpOptimWrapper', bf16_on_cpu=True,
                             optimizer=dict(type='SGD', lr=0.05, momentum=0.9))
    runner = RUNNERS.build(cfg)
    encoder = set()
    _record_output_dtypes(runner.model.momentum_backbone.model.layer4, encoder)
    runner.train()
    assert isinstance(runner.optim_wrapper, CPUBfloat16OptimWrapper)
    assert encoder == {torch.bfloat16}  # extraction and keys ran in bfloat16
    for name, seen in (('k-means', kmeans), ('κ', kappa)):
        assert seen['output'] == {torch.float32}, (name, seen['output'])
        assert 'aten::mm' in seen or 'aten::addmm' in seen, (name, seen.keys())
        assert _low_precision(seen) == {}, f'bfloat16 reached {name}'


def test_bf16_on_cpu_refuses_another_dtype():
    wrapper = dict(type='AutoAmpOptimWrapper', bf16_on_cpu=True, dtype='float16',
                   optimizer=dict(type='SGD', lr=0.1))
    with pytest.raises(ValueError, match=r"bf16_on_cpu=True autocasts to bfloat16 .* got "
                                         r"dtype='float16': remove dtype"):
        build_optim_wrapper(torch.nn.Linear(2, 2), wrapper)
