"""Moves multi-view batches to the device, makes the views there when asked, and normalises them."""
from typing import Sequence

import torch
from mmengine.model import BaseDataPreprocessor

from ifnd.datasets.decode import decode_images, decoder_names
from ifnd.datasets.device_augment import DeviceAugmentCache
from ifnd.device import CompileSetting, to_device
from ifnd.registry import MODELS


@MODELS.register_module()
class ContrastiveDataPreprocessor(BaseDataPreprocessor):
    """Turns a collated batch into ``{'inputs': [views], 'data_samples': {'index', 'label'}}``.

    Normalising on the device keeps the loader's work (and host-to-device traffic) small. A batch
    from a data set with ``augment_on='device'`` carries raw images (uint8 ``[B, C, H, W]``, or
    encoded files with their ``'path'``: one buffer and each file's byte count, ``'encoded_sizes'``)
    and its view pipeline under ``'augment'``: files are
    decoded here (JPEGs on the device, by ``decoder``: 'torchcodec', 'torchvision', or 'auto',
    TorchCodec where it decodes, else torchvision; :mod:`ifnd.datasets.decode`) and the views made in
    batches, drawn per sample on the device without host syncs (:mod:`ifnd.datasets.device_augment`),
    and normalised with them: ``compile`` ('auto': on CUDA; True; False; or ``torch.compile``
    options) compiles the views whole, a few kernels a batch.
    """

    def __init__(self, mean: Sequence[float] = (0.485, 0.456, 0.406),
                 std: Sequence[float] = (0.229, 0.224, 0.225), non_blocking: bool = True,
                 decoder: str = 'auto', compile: CompileSetting = 'auto') -> None:
        super().__init__(non_blocking)
        decoder_names(decoder)  # an unknown name fails when the model is built, not at the first batch
        self.decoder = decoder
        self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer('std', torch.tensor(std, dtype=torch.float32).view(-1, 1, 1), False)
        self._device_views = DeviceAugmentCache(compile)

    def forward(self, data: dict, training: bool = False) -> dict:
        """Normalised views on the model's device, plus sample indices and labels."""
        pipeline = data.get('augment') if isinstance(data, dict) else None
        if pipeline is not None:
            data = dict(data)
            del data['augment']
            raw = data.pop('inputs')
            paths = data.pop('path', None)
            sizes = data.pop('encoded_sizes', None)
            device = self.mean.device
            if sizes is not None:  # encoded files in one buffer, read on the CPU: decode on the device
                raw = decode_images(torch.split(raw, list(sizes)), paths, device, self.decoder)
            elif not isinstance(raw, torch.Tensor):  # encoded files, one tensor each
                raw = decode_images(raw, paths, device, self.decoder)
            else:
                raw = to_device(raw, device)
            views = self._device_views.get(pipeline, device)(raw, mean=self.mean, std=self.std)
        else:
            data = self.cast_data(data)
            views = data['inputs']
            if isinstance(views, torch.Tensor):
                views = [views]
            views = [(v.float() - self.mean) / self.std for v in views]
        device = self.mean.device
        samples = {key: to_device(data[key], device) for key in ('index', 'label') if key in data}
        return {'inputs': views, 'data_samples': samples}
