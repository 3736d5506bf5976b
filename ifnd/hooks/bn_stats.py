"""Same BatchNorm running statistics on every process at each epoch's end."""
import torch
from mmengine.dist import all_reduce, get_world_size
from mmengine.hooks import Hook
from torch.nn.modules.batchnorm import _BatchNorm

from ifnd.engine.features import unwrap_model
from ifnd.registry import HOOKS


def average_bn_statistics(model: torch.nn.Module) -> int:
    """Average the running mean and variance of ``model``'s training-mode BN layers over processes.

    Only layers that update their statistics (training mode, ``track_running_stats``) are averaged:
    eval-mode ones (a frozen backbone) are already equal everywhere. Every other buffer, floating
    point or not, is left alone. Returns the number of layers averaged (0 in one process).
    """
    if get_world_size() == 1:
        return 0
    layers = [m for m in model.modules()
              if isinstance(m, _BatchNorm) and m.training and m.track_running_stats]
    stats = [s for m in layers for s in (m.running_mean, m.running_var)]
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for stat in stats:
        by_kind.setdefault((stat.dtype, stat.device), []).append(stat)
    # One all-reduce per dtype and device (a single one for a float32 model on one device).
    for tensors in by_kind.values():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        all_reduce(flat, op='mean')
        for tensor, synced in zip(tensors, flat.split([t.numel() for t in tensors])):
            tensor.copy_(synced.view_as(tensor))
    return len(layers)


@HOOKS.register_module()
class SyncBNStatsHook(Hook):
    """Averages BatchNorm running statistics over the processes at the end of each training epoch.

    mmengine wraps the model in DDP with ``broadcast_buffers=False``, so each process's BN layers
    (the encoder's and MoCo's key encoder's) track the statistics of its own batches, and only rank
    0's are saved. Without this, the eval-mode features each process extracts for its shard of a
    clustering round or kNN evaluation come from other statistics than rank 0's, and a resumed run
    (every rank loads rank 0's) extracts other features, hence other pseudo labels, than the
    uninterrupted one. Averaged before those hooks and the checkpoint, the statistics are the same
    everywhere and the checkpoint holds what every rank uses.

    Not mmengine's ``SyncBuffersHook``: it averages every buffer, and its mean all-reduce divides in
    float32 and writes back, so an int64 buffer stays exact only while world size x |value| < 2**24
    (the label bank's labels of unaccepted samples are -(index + 1): wrong from 16 processes on
    ImageNet), and it would send the MoCo queue and the label bank (tens of MB) every epoch.
    """

    # Before PseudoLabelHook (NORMAL), KNNEvalHook (LOW) and CheckpointHook (VERY_LOW); after the
    # loss checks (HIGH), which stop a diverged run first.
    priority = 'ABOVE_NORMAL'

    def after_train_epoch(self, runner) -> None:
        """Average the BN running statistics of the model over the processes."""
        average_bn_statistics(unwrap_model(runner.model))
