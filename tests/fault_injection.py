"""Kills the training process at a chosen point, as a crash or an operator would.

Imported by a training run through ``custom_imports``; ``IFND_FAULT`` says where to die:
``iteration:E.B`` (after batch B of epoch E, both from 1), ``clustering:E`` (inside the k-means of the round after
epoch E), ``checkpoint_write:E`` (half-way through writing epoch_E.pth) or
``after_checkpoint:E`` (right after epoch_E.pth is saved).
"""
import os
import signal

from mmengine.dist import barrier
from mmengine.hooks import Hook

import ifnd.clustering.round as clustering_round
import ifnd.hooks.pseudo_label_hook as pseudo_label_hook
from ifnd.fileio import TEMP_PREFIX, AtomicLocalBackend
from ifnd.registry import HOOKS

POINT, _, WHEN = os.environ.get('IFND_FAULT', ':').partition(':')


def die() -> None:
    """SIGKILL this process: no handler, no cleanup, no flush."""
    os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class FaultInjectionHook(Hook):
    """Dies after an iteration or after a checkpoint, per ``IFND_FAULT``."""

    priority = 'LOWEST'  # after CheckpointHook (VERY_LOW) has saved the epoch

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if POINT == 'iteration' and WHEN == f'{runner.epoch + 1}.{batch_idx + 1}':
            die()

    def after_train_epoch(self, runner) -> None:
        if POINT == 'after_checkpoint' and runner.epoch + 1 == int(WHEN):
            barrier()  # with several processes: none dies before rank 0 has written the checkpoint
            die()


if POINT == 'clustering':
    real_round = pseudo_label_hook.PseudoLabelHook.run_round
    real_hierarchies = dict(clustering_round.HIERARCHIES)
    current_round = {}

    def run_round_noting_epoch(self, runner, epochs_done: int, *args, **kwargs):
        current_round['epoch'] = epochs_done
        return real_round(self, runner, epochs_done, *args, **kwargs)

    def then_die(cluster):
        def cluster_then_die(*args, **kwargs):
            results = cluster(*args, **kwargs)
            if current_round.get('epoch') == int(WHEN):
                die()  # features extracted and clustered, labels not yet in the bank
            return results
        return cluster_then_die

    pseudo_label_hook.PseudoLabelHook.run_round = run_round_noting_epoch
    clustering_round.HIERARCHIES.update(
        {name: then_die(cluster) for name, cluster in real_hierarchies.items()})

if POINT == 'checkpoint_write':
    real_put = AtomicLocalBackend.put

    def put_half_then_die(self, obj: bytes, filepath) -> None:
        if os.path.basename(str(filepath)) == f'epoch_{WHEN}.pth':
            folder = os.path.dirname(os.path.abspath(filepath))
            with open(os.path.join(folder, TEMP_PREFIX + 'partial' + os.path.basename(filepath)), 'wb') as f:
                f.write(obj[:len(obj) // 2])
                f.flush()
            die()
        real_put(self, obj, filepath)

    AtomicLocalBackend.put = put_half_then_die
