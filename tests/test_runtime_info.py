"""Step outputs logged without a host sync in every iteration (BufferedRuntimeInfoHook) and the
NaN check on what it flushes (FiniteLossHook)."""
import glob
import json
import os.path as osp

import numpy as np
import pytest
import torch
from helpers import HostSyncOps, digits_config
from mmengine.hooks import Hook

from ifnd.hooks import BufferedRuntimeInfoHook
from ifnd.models import SimCLR
from ifnd.registry import RUNNERS

LOG_INTERVAL = 3
ITERS_PER_EPOCH = 5  # 337 digits (a quarter of the train split) in batches of 64


def _config(tmp_path, name: str, runtime_info: str, **overrides):
    cfg = digits_config(str(tmp_path / name), dict(type='IFNDMoCo', temperature=0.2, queue_len=128,
                                                   momentum=0.99), max_epochs=2,
                       pseudo_labels=dict(num_clusters=[5, 10], interval=1,
                                          kmeans=dict(nredo=1, niter=5)), **overrides)
    cfg.train_dataloader.dataset.subset_fraction = 0.25
    cfg.default_hooks.logger.update(interval=LOG_INTERVAL, ignore_last=False)  # also each epoch's end
    cfg.default_hooks.runtime_info = dict(type=runtime_info)
    cfg.log_processor = dict(window_size=4, by_epoch=True)
    cfg.param_scheduler = dict(type='CosineAnnealingLR', T_max=2, by_epoch=True)
    cfg.experiment_name = f'{name}_{runtime_info}'  # its own message hub, whatever the second
    return cfg


class _Window(Hook):
    """Marks the host-sync count where an iteration's hooks start (HIGHEST) or end (LOWEST)."""

    def __init__(self, mode: HostSyncOps, marks: list, start: bool) -> None:
        self.mode, self.marks, self.start = mode, marks, start

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if self.start:
            self.marks.append([len(self.mode.seen)])

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if not self.start:
            self.marks[-1].append(len(self.mode.seen))


def _train_counting_syncs(cfg):
    """Train; per iteration, the host-sync ops from its first hook to its last (the step included)."""
    torch.manual_seed(0)
    runner = RUNNERS.build(cfg)
    mode, marks = HostSyncOps(), []
    runner.register_hook(_Window(mode, marks, start=True), priority='HIGHEST')
    runner.register_hook(_Window(mode, marks, start=False), priority='LOWEST')
    with mode:
        runner.train()
    return runner, [end - begin for begin, end in marks]


def _logged(work_dir) -> list[dict]:
    """The rows of scalars.json, without the timings (of the steps and the clustering rounds)."""
    (path,) = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k not in ('time', 'data_time') and 'seconds' not in k}
            for row in rows]


def test_training_syncs_only_when_logging_and_logs_what_mmengine_logs(tmp_path, monkeypatch):
    flushes = []
    flush = BufferedRuntimeInfoHook.flush

    def recording_flush(self, runner):
        if self._pending:
            flushes.append(runner.iter + 1)
        flush(self, runner)

    monkeypatch.setattr(BufferedRuntimeInfoHook, 'flush', recording_flush)
    buffered, syncs = _train_counting_syncs(_config(tmp_path, 'buffered', 'BufferedRuntimeInfoHook'))
    assert len(syncs) == 2 * ITERS_PER_EPOCH
    # The first step, every LOG_INTERVAL-th of an epoch and each epoch's last.
    assert flushes == [1, 3, 5, 8, 10]
    quiet = [i for i in range(1, 11) if i not in flushes]
    assert [syncs[i - 1] for i in quiet] == [0] * len(quiet), syncs

    stock, stock_syncs = _train_counting_syncs(_config(tmp_path, 'stock', 'RuntimeInfoHook'))
    assert all(n > 0 for n in stock_syncs), 'the count sees mmengine hook\'s .item() in every step'
    logged = [key for key in stock.message_hub.log_scalars
              if key.startswith('train/') and key not in ('train/time', 'train/data_time')]
    assert 'train/loss' in logged
    for key in logged:  # values and counts, iteration by iteration
        for ours, theirs in zip(buffered.message_hub.get_scalar(key).data,
                                stock.message_hub.get_scalar(key).data):
            np.testing.assert_array_equal(ours, theirs)
    assert list(buffered.message_hub.log_scalars) == list(stock.message_hub.log_scalars)
    rows = _logged(tmp_path / 'buffered')
    assert sum('loss' in row for row in rows) == 4 and rows == _logged(tmp_path / 'stock')
    # Each epoch's checkpoint holds the message hub with every iteration of the epoch.
    ckpt = torch.load(tmp_path / 'buffered' / 'epoch_1.pth', weights_only=False)
    assert len(ckpt['message_hub']['log_scalars']['train/loss'].data[0]) == ITERS_PER_EPOCH


@pytest.mark.parametrize('runtime_info', ['BufferedRuntimeInfoHook', 'RuntimeInfoHook'])
def test_nan_loss_named_at_its_iteration_with_the_last_finite_loss(tmp_path, monkeypatch,
                                                                   runtime_info):
    calls = []
    finite_loss = SimCLR.loss

    def loss_nan_at_second_step(self, inputs, data_samples):
        out = finite_loss(self, inputs, data_samples)
        calls.append(float(out['loss'].detach()))
        if len(calls) == 2:
            out['loss'] = out['loss'] * float('nan')
        return out

    monkeypatch.setattr(SimCLR, 'loss', loss_nan_at_second_step)
    cfg = digits_config(str(tmp_path), dict(type='SimCLR', temperature=0.5), max_epochs=1)
    cfg.train_dataloader.dataset.subset_fraction = 0.25
    cfg.default_hooks.logger.interval = 4
    cfg.default_hooks.runtime_info = dict(type=runtime_info)
    cfg.experiment_name = f'nan_{runtime_info}'
    runner = RUNNERS.build(cfg)
    with pytest.raises(FloatingPointError) as err:
        runner.train()
    assert (f'the loss became nan at iteration 2 (epoch 1); the last finite loss was '
            f'{calls[0]:.6g} at iteration 1') in str(err.value)
    # Buffered: the NaN step is found at the next flush (the logger's iteration 4).
    assert len(calls) == (4 if runtime_info == 'BufferedRuntimeInfoHook' else 2)


def test_buffered_hook_refuses_bad_interval_and_non_scalar_outputs():
    with pytest.raises(ValueError, match='interval must be a positive integer'):
        BufferedRuntimeInfoHook(interval=0)
    with pytest.raises(ValueError, match=r"output 'loss' has shape \(2,\)"):
        BufferedRuntimeInfoHook._detached({'loss': torch.ones(2)})


def test_flushes_at_its_interval_the_loggers_iteration_checkpoints_and_epoch_ends():
    import types
    hook = BufferedRuntimeInfoHook(interval=4)
    hook._log_intervals, hook._checkpoint_intervals = [3], [7]  # as before_train finds them
    hook._every = 4
    runner = types.SimpleNamespace(train_dataloader=[None] * 5, max_iters=12, iter=0)
    due = []
    for iteration in range(1, 13):
        runner.iter = iteration - 1
        if hook._due(runner, batch_idx=(iteration - 1) % 5):
            due.append(iteration)
    # first; inner 3 and 4 of each epoch of 5; epoch ends 5, 10; checkpoint 7; last 12
    assert due == [1, 3, 4, 5, 7, 8, 9, 10, 12]
