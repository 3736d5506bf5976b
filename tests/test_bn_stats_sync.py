"""SyncBNStatsHook: every process ends a training epoch with the mean of the processes' BN running
statistics (encoder and MoCo key encoder), every other buffer untouched."""
import os
import types

import torch
import torch.distributed as dist
from helpers import TINY_BACKBONE, TINY_NECK, end_gloo_worker, free_port, run_ranks
from mmengine.config import Config
from mmengine.hooks import CheckpointHook
from mmengine.registry import init_default_scope
from mmengine.runner import get_priority
from torch.nn.modules.batchnorm import _BatchNorm

from ifnd.hooks import KNNEvalHook, PseudoLabelHook, SyncBNStatsHook, average_bn_statistics
from ifnd.registry import MODELS

WORLD_SIZE = 2
# A label of an unaccepted sample, -(index + 1), beyond float32's exact integers once summed over
# the processes: mmengine's SyncBuffersHook would write back -2**24 + 1 .. -2**24 - 1 rounded.
BIG_LABEL = -(2 ** 24) - 1


def _model(rank: int) -> torch.nn.Module:
    """Tiny IFND-MoCo whose BN statistics, BN counters and queue depend on ``rank``."""
    init_default_scope('ifnd')
    torch.manual_seed(0)
    model = MODELS.build(dict(type='IFNDMoCo', temperature=0.2, backbone=TINY_BACKBONE, neck=TINY_NECK,
                              queue_len=32))
    model.label_bank.reset(2, 10)
    model.label_bank.labels[0, 0] = BIG_LABEL
    model.queue.add_(rank)  # a float buffer that is not BN's: kept as each process has it
    model.train()
    gen = torch.Generator().manual_seed(100 + rank)
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen))
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
            m.num_batches_tracked.fill_(7 + rank)
    model.backbone.model.bn1.eval()  # eval mode (frozen): its statistics never change, left alone
    return model


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    model = _model(rank)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    SyncBNStatsHook().after_train_epoch(types.SimpleNamespace(model=model))
    torch.save({'before': before, 'after': model.state_dict()}, os.path.join(out_dir, f'rank{rank}.pt'))
    end_gloo_worker()


def test_two_processes_end_with_the_mean_bn_statistics_and_other_buffers_untouched(tmp_path):
    run_ranks(_worker, (free_port(), str(tmp_path)), WORLD_SIZE)
    ranks = [torch.load(tmp_path / f'rank{r}.pt', weights_only=True) for r in range(WORLD_SIZE)]
    averaged = [k for k in ranks[0]['before'] if k.endswith(('running_mean', 'running_var'))
                and not k.startswith('backbone.model.bn1.')]
    assert any(k.startswith('momentum_backbone.') for k in averaged)  # the key encoder's split BN
    assert any(k.startswith('momentum_neck.') for k in averaged)
    for key in averaged:
        mean = (ranks[0]['before'][key] + ranks[1]['before'][key]) / 2
        assert not torch.equal(ranks[0]['before'][key], ranks[1]['before'][key])
        for r in ranks:
            torch.testing.assert_close(r['after'][key], mean, rtol=0, atol=0)
    for r in ranks:  # everything else as it was: counters, eval-mode BN, label bank, queue, weights
        for key in set(r['before']) - set(averaged):
            assert torch.equal(r['after'][key], r['before'][key]), key
        assert r['after']['label_bank.labels'].dtype == torch.long
        assert r['after']['label_bank.labels'][0, 0] == BIG_LABEL
    assert ranks[0]['after']['backbone.model.layer1.0.bn1.num_batches_tracked'] == 7
    assert ranks[1]['after']['backbone.model.layer1.0.bn1.num_batches_tracked'] == 8


def test_one_process_changes_nothing():
    model = _model(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert average_bn_statistics(model) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_sync_runs_by_default_before_clustering_knn_and_checkpoint():
    cfg = Config.fromfile(os.path.join(os.path.dirname(__file__), '..', 'configs', '_base_',
                                       'default_runtime.py'))
    assert cfg.default_hooks.sync_bn_stats.type == 'SyncBNStatsHook'
    sync = get_priority(SyncBNStatsHook.priority)
    for later in (PseudoLabelHook, KNNEvalHook, CheckpointHook):
        assert sync < get_priority(later.priority), later.__name__
