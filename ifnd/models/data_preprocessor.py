"""Moves multi-view batches to the device and normalises them there."""
from typing import Sequence

import torch
from mmengine.model import BaseDataPreprocessor

from ifnd.registry import MODELS


@MODELS.register_module()
class ContrastiveDataPreprocessor(BaseDataPreprocessor):
    """Turns a collated batch into ``{'inputs': [views], 'data_samples': {'index', 'label'}}``.

    Normalising on the device keeps the loader's work (and host-to-device traffic) small.
    """

    def __init__(self, mean: Sequence[float] = (0.485, 0.456, 0.406),
                 std: Sequence[float] = (0.229, 0.224, 0.225), non_blocking: bool = True) -> None:
        super().__init__(non_blocking)
        self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer('std', torch.tensor(std, dtype=torch.float32).view(-1, 1, 1), False)

    def forward(self, data: dict, training: bool = False) -> dict:
        """Normalised views on the model's device, plus sample indices and labels."""
        data = self.cast_data(data)
        views = data['inputs']
        if isinstance(views, torch.Tensor):
            views = [views]
        views = [(v.float() - self.mean) / self.std for v in views]
        samples = {key: data[key] for key in ('index', 'label') if key in data}
        return {'inputs': views, 'data_samples': samples}
