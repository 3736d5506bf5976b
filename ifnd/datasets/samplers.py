"""Samplers whose every item carries its own augmentation seed, so runs resume exactly."""
from collections.abc import Iterator

from mmengine.dataset import DefaultSampler

from ifnd.registry import DATA_SAMPLERS

_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads nearby (seed, epoch, index) apart


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of sample ``index`` in ``epoch`` of a run seeded with ``seed``."""
    return (((seed * _MIX + epoch) * _MIX + index) * _MIX) % (1 << 63)


@DATA_SAMPLERS.register_module()
class SeededSampler(DefaultSampler):
    """mmengine's ``DefaultSampler`` that yields ``(index, augmentation seed)`` pairs.

    A sample's random views depend only on the run's seed, the epoch and the sample index: not on
    the loader workers' state, their number, persistence or the process count. An epoch restarted
    after a crash therefore sees the same views as the uninterrupted run, and two processes see
    the same views as one process with the same global batch. A data set whose views are made on
    the device (``augment_on='device'``), which draws from the device's generator, gets the plain
    indices.
    """

    def __iter__(self) -> Iterator[tuple[int, int] | int]:
        if getattr(self.dataset, 'device_pipeline', None) is not None:
            yield from super().__iter__()
            return
        for index in super().__iter__():
            yield index, sample_seed(self.seed, self.epoch, index)
