"""Two gloo processes give the same pseudo labels, loss, gradients, MoCo queue (NNCLR's support set)
and false-negative detection counts as one process (MoCo v3: its keys gathered over the processes;
NNCLR: its predictions)."""
import os
import types

import pytest
import torch
import torch.distributed as dist
from helpers import TINY_BACKBONE, TINY_NECK, end_gloo_worker, free_port, run_ranks
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope

from ifnd.registry import HOOKS, MODELS

WORLD_SIZE = 2
GLOBAL_BATCH = 8
DIGITS = dict(type='Digits', split='train', subset_fraction=0.2)
EVAL_VIEW = dict(type='EvalView', size=16)


def _build(model_type: str) -> torch.nn.Module:
    init_default_scope('ifnd')
    torch.manual_seed(0)
    model_type, _, compiled = model_type.partition('+')
    # MoCo v2's queue; MoCo v3 (the batch's keys, gathered) has none.
    moco = 'MoCo' in model_type and 'MoCoV3' not in model_type
    extra = dict(queue_len=32, bn_splits=WORLD_SIZE) if moco else {}
    if model_type == 'FNC':  # top_k of the 7 other images of the global batch
        extra = dict(num_support_views=2, top_k=2)
    if model_type.startswith('NNCLR'):  # a support set the first step reads and fills
        extra = dict(support_size=16, predictor=dict(type='MLPNeck', hidden_dim=16))
        if model_type == 'NNCLR-IFND':  # IFND's pseudo labels on the NNCLR base
            extra.update(detector=dict(type='PseudoLabels'), treatment='elim')
        model_type = 'NNCLR'
    # '+compiled': the projection head and loss traced as the GPU recipes compile them (dynamo and
    # AOTAutograd, the gathers inside the graph; inductor's code for it is checked on one process in
    # test_gpu_recipe_cpu.py).
    backbone = dict(TINY_BACKBONE, compile=dict(backend='aot_eager')) if compiled else TINY_BACKBONE
    model = MODELS.build(dict(type=model_type, temperature=0.5, backbone=backbone, neck=TINY_NECK,
                              **extra))
    # BN in eval mode normalises each sample alone, so shards and the whole batch agree exactly;
    # what is compared is the cross-process gathering of the contrastive loss.
    model.eval()
    model.track_detection = model.records_detection  # the counts must add up over the ranks
    if moco:
        # The key encoder's BN normalises with the statistics of its shuffled sub-batch, so the
        # keys are right only if the cross-process shuffle gives each rank the sub-batch that
        # one process gives each of its bn_splits chunks.
        model.momentum_backbone.train()
        model.momentum_neck.train()
    return model


def _batch(num_views: int = 2) -> tuple[list[torch.Tensor], dict]:
    gen = torch.Generator().manual_seed(1)
    views = [torch.rand(GLOBAL_BATCH, 3, 16, 16, generator=gen) for _ in range(num_views)]
    index = torch.randperm(269, generator=gen)[:GLOBAL_BATCH]
    return views, {'index': index, 'label': torch.randint(0, 3, (GLOBAL_BATCH, ), generator=gen)}


def _pseudo_label_round(model: torch.nn.Module, work_dir: str) -> torch.Tensor:
    hook = HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5, 10],
                            acceptance=dict(type='ConstantAcceptance', final_rate=0.6), dataset=DIGITS, pipeline=EVAL_VIEW, batch_size=32,
                            num_workers=0, kmeans=dict(niter=10, nredo=1), save_labels=False))
    runner = types.SimpleNamespace(
        model=model, max_epochs=10, work_dir=work_dir, logger=MMLogger.get_instance('ifnd-test'),
        visualizer=types.SimpleNamespace(add_scalars=lambda *args, **kwargs: None))
    model.label_bank.reset(2, 269)
    hook.run_round(runner, 1)
    return model.label_bank.labels.clone()


def _views(model) -> int:
    return 2 + getattr(model, 'num_support_views', 0)


def _loss_and_grads(model, views, samples) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
    model.zero_grad()
    torch.manual_seed(2)  # MoCo's key shuffle: rank 0 draws it as one process does
    loss = model.loss(views, samples)['loss']
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, getattr(model, 'queue', getattr(model, 'support', None))


def _worker(rank: int, port: int, model_type: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    model = _build(model_type)
    labels = _pseudo_label_round(model, out_dir) if 'IFND' in model_type else None
    views, samples = _batch(_views(model))
    shard = slice(rank * GLOBAL_BATCH // WORLD_SIZE, (rank + 1) * GLOBAL_BATCH // WORLD_SIZE)
    loss, grads, queue = _loss_and_grads(model, [v[shard] for v in views],
                                  {k: v[shard] for k, v in samples.items()})
    # What DDP does: average the losses and the gradients over the processes.
    dist.all_reduce(loss)
    for grad in grads.values():
        dist.all_reduce(grad)
    counts = model.detection_counts
    if counts is not None:  # what FalseNegativeDetectionHook does: sum them over the processes
        dist.all_reduce(counts)
    if rank == 0:
        torch.save({'loss': loss / WORLD_SIZE, 'labels': labels, 'queue': queue, 'counts': counts,
                    'grads': {k: g / WORLD_SIZE for k, g in grads.items()}},
                   os.path.join(out_dir, 'dist.pt'))
    end_gloo_worker()


@pytest.mark.parametrize('model_type', ['SimCLR', 'IFND', 'MoCoV2', 'IFNDMoCo', 'DebiasedCL',
                                        'HardNegativeCL', 'FNC', 'IFND+compiled', 'MoCoV3',
                                        'IFNDMoCoV3', 'NNCLR', 'NNCLR-IFND'])
def test_two_processes_match_one(tmp_path, model_type):
    run_ranks(_worker, (free_port(), model_type, str(tmp_path)), WORLD_SIZE)
    got = torch.load(tmp_path / 'dist.pt', weights_only=True)

    model = _build(model_type.partition('+')[0])  # one process, uncompiled
    if 'IFND' in model_type:
        labels = _pseudo_label_round(model, str(tmp_path))
        torch.testing.assert_close(got['labels'], labels, rtol=0, atol=0)
        assert (labels >= 0).float().mean().item() == pytest.approx(0.6, abs=0.01)
    loss, grads, queue = _loss_and_grads(model, *_batch(_views(model)))
    torch.testing.assert_close(got['loss'], loss, rtol=1e-5, atol=1e-6)
    if model.records_detection:
        torch.testing.assert_close(got['counts'], model.detection_counts, rtol=0, atol=0)
    if queue is not None:  # the keys (NNCLR: projections) of both ranks, enqueued in rank order
        torch.testing.assert_close(got['queue'], queue, rtol=1e-5, atol=1e-6)
    assert grads.keys() == got['grads'].keys()
    for name, grad in grads.items():
        torch.testing.assert_close(got['grads'][name], grad, rtol=1e-4, atol=1e-6, msg=name)
