"""Contrastive views made in batches on the training device with kornia, and JPEG decoding there.

The view parameters are those the CPU views (:class:`~ifnd.datasets.transforms.ContrastiveView` and
its SimCLR / MoCo v2 presets) resolve from the same config dict, so one config describes both paths.
Every random draw is per sample and comes from torch's default generator of the images' device,
which the per-epoch re-seeding covers.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torchvision.io import ImageReadMode, decode_image, decode_jpeg
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from .transforms import ContrastiveView, MultiView, PipelineCfg, build_pipeline

JPEG_MAGIC = b'\xff\xd8\xff'


class CorruptImageError(OSError):
    """An image file exists but cannot be decoded."""


def import_kornia() -> Any:
    """The ``kornia.augmentation`` module, or an error saying how to install it."""
    try:
        import kornia.augmentation as K
    except ImportError as e:
        raise ImportError("augment_on='device' needs kornia: `pip install kornia` (or `pip install ifnd[device]`), "
                          "or set augment_on='cpu'") from e
    return K


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def device_views_of(pipeline: PipelineCfg) -> list[ContrastiveView] | None:
    """The CPU contrastive views a training pipeline makes, or None when it is something else (e.g. EvalView)."""
    built = pipeline if isinstance(pipeline, (ContrastiveView, MultiView)) else build_pipeline(pipeline)
    if isinstance(built, ContrastiveView):
        return [built]
    if isinstance(built, MultiView) and all(isinstance(t, ContrastiveView) for t in built.transforms):
        return list(built.transforms)
    return None


class DeviceView(nn.Module):
    """One random view of a batch: kornia's crop, colour jitter, grayscale, blur and flip, drawn per sample."""

    def __init__(self, view: ContrastiveView) -> None:
        super().__init__()
        K = import_kornia()
        p = view.params
        self.size = _pair(p['size'])
        self.scale, self.ratio = tuple(p['scale']), tuple(p['ratio'])
        self.crop = K.RandomResizedCrop(self.size, scale=self.scale, ratio=self.ratio, cropping_mode='resample')
        ops = [K.ColorJitter(*p['jitter'], p=p['jitter_p']), K.RandomGrayscale(p=p['grayscale_p'])]
        if p['blur_p'] > 0:
            k = p['blur_kernel']
            ops.append(K.RandomGaussianBlur((k, k), sigma=p['blur_sigma'], p=p['blur_p']))
        if p['flip']:
            ops.append(K.RandomHorizontalFlip(p=0.5))
        self.colour = nn.Sequential(*ops)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Views ``[B, 3, h, w]`` (float32 in [0, 1]) of same-size images ``[B, C, H, W]`` (uint8 or float)."""
        return self.colour(self.crop(to_float_rgb(images)))

    def from_list(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Views of images of different sizes: each cropped (torchvision's sampling, antialiased), then batched."""
        crops = []
        for img in images:
            top, left, h, w = v2.RandomResizedCrop.get_params(img, list(self.scale), list(self.ratio))
            crops.append(TF.resized_crop(img, top, left, h, w, list(self.size), antialias=True))
        return self.colour(to_float_rgb(torch.stack(crops)))


def to_float_rgb(images: torch.Tensor) -> torch.Tensor:
    """A uint8 or float batch ``[B, 1 or 3, H, W]`` as float32 RGB in [0, 1]."""
    if images.dtype == torch.uint8:
        images = images.float().div_(255)
    elif images.dtype != torch.float32:
        images = images.float()
    if images.shape[1] == 1:
        images = images.expand(-1, 3, -1, -1)
    elif images.shape[1] != 3:
        raise ValueError(f'Images must have 1 or 3 channels, got a batch of shape {tuple(images.shape)}')
    return images


class DeviceViews(nn.Module):
    """All views of a batch (one :class:`DeviceView` per view of the pipeline), made on the images' device."""

    def __init__(self, pipeline: PipelineCfg) -> None:
        super().__init__()
        views = device_views_of(pipeline)
        if views is None:
            raise ValueError(f'Device augmentation needs a ContrastiveView-type pipeline (e.g. MoCoV2View, SimCLRView) '
                             f'or a MultiView of them, got {pipeline!r}; use augment_on=\'cpu\' for other pipelines')
        # A view config repeated num_views times gives independent draws from one module.
        self.views = nn.ModuleList([DeviceView(v) for v in views])

    def forward(self, images: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Views of a uint8 batch ``[B, C, H, W]``, or of a list of ``[C, H, W]`` images of any sizes."""
        if isinstance(images, torch.Tensor):
            return [v(images) for v in self.views]
        return [v.from_list(images) for v in self.views]


def decode_images(encoded: Sequence[torch.Tensor], paths: Sequence[str] | None = None,
                  device: torch.device | str = 'cpu') -> list[torch.Tensor]:
    """Decode encoded image files (1-D uint8 CPU tensors) to RGB uint8 ``[3, H, W]`` on ``device``.

    JPEGs are decoded together by ``decode_jpeg`` on ``device`` (nvJPEG on CUDA); other formats on the CPU.
    """
    device = torch.device(device)
    paths = list(paths) if paths is not None else [f'<item {i}>' for i in range(len(encoded))]
    out: list[torch.Tensor | None] = [None] * len(encoded)
    jpeg = [i for i, e in enumerate(encoded) if bytes(e[:3].tolist()) == JPEG_MAGIC]
    if jpeg:
        try:
            decoded = decode_jpeg([encoded[i] for i in jpeg], mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            decoded = [_decode_one(encoded[i], paths[i], device, jpeg=True) for i in jpeg]  # find the bad file
        for i, img in zip(jpeg, decoded):
            out[i] = img
    for i, e in enumerate(encoded):
        if out[i] is None:
            out[i] = _decode_one(e, paths[i], device, jpeg=False)
    return out  # type: ignore[return-value]


def _decode_one(data: torch.Tensor, path: str, device: torch.device, jpeg: bool) -> torch.Tensor:
    if jpeg and device.type != 'cpu':
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            pass  # e.g. a CMYK JPEG nvJPEG does not take: the CPU decoder may
    try:
        image = decode_image(data, mode=ImageReadMode.RGB)
    except RuntimeError as e:
        raise CorruptImageError(f"Cannot decode image '{path}' ({str(e).splitlines()[0]}); remove or replace the "
                                'file, or leave it out of the data set') from e
    if image.dtype == torch.uint16:  # 16-bit PNGs: the top byte, as the CPU path (datasets.to_rgb)
        image = image.to(torch.int32).bitwise_right_shift_(8).to(torch.uint8)
    return image.to(device)


class DeviceAugmentCache:
    """The :class:`DeviceViews` of each pipeline config met in batches, built once and kept on a device."""

    def __init__(self) -> None:
        self._built: dict[str, DeviceViews] = {}

    def get(self, pipeline: PipelineCfg, device: torch.device) -> DeviceViews:
        """The views module of ``pipeline`` on ``device``."""
        key = f'{device}|{pipeline!r}'
        views = self._built.get(key)
        if views is None:
            # kornia draws its random numbers on the device its modules were moved to.
            views = self._built[key] = DeviceViews(copy.deepcopy(pipeline)).to(device)
        return views
