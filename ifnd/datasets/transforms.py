"""Image views for contrastive pre-training and evaluation, built on ``torchvision.transforms.v2``.

Every single-view transform maps a PIL image to a float32 tensor ``[3, H, W]`` in ``[0, 1]``;
mean/std normalisation is left to the model's data preprocessor so it runs on the device.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Union

import torch
from torchvision.transforms import v2

from ifnd.registry import TRANSFORMS
from ifnd.settings import ReadWhen, check_number

Size = Union[int, Sequence[int]]
PipelineCfg = Union[None, dict, Callable, Sequence[Any]]

# Crops at least this large are "ImageNet-size": presets add Gaussian blur and EvalView resizes.
LARGE_IMAGE_SIZE = 96


def _min_side(size: Size) -> int:
    return int(size) if isinstance(size, int) else int(min(size))


def blur_kernel_size(size: Size) -> int:
    """Odd Gaussian-blur kernel size of about 10% of the crop's shorter side (at least 3)."""
    return max(3, int(0.1 * _min_side(size)) // 2 * 2 + 1)


def to_float_tensor() -> list[v2.Transform]:
    """Return the transforms that turn a PIL image into a float32 tensor scaled to [0, 1]."""
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]


def build_pipeline(cfg: PipelineCfg) -> Callable:
    """Build a transform from a config dict, a list of them (composed), a callable or None (to tensor)."""
    if cfg is None:
        return v2.Compose(to_float_tensor())
    if isinstance(cfg, dict):
        return TRANSFORMS.build(cfg)
    if isinstance(cfg, (list, tuple)):
        return v2.Compose([build_pipeline(c) for c in cfg])
    if callable(cfg):
        return cfg
    raise TypeError(f'A pipeline must be a config dict, a list, a callable or None, got {type(cfg).__name__}')


@TRANSFORMS.register_module()
class ContrastiveView(v2.Compose):
    """One random augmented view: crop, colour jitter, grayscale, optional blur, flip, optional solarisation.

    ``solarize_threshold`` is on the [0, 1] scale of float images: 0.5 inverts the pixels >= 128 of 255,
    as BYOL's (PIL's) solarisation at 128.
    """

    # An operation's settings are read only where it is applied (a None probability: its preset's).
    read_when = {'jitter': ReadWhen('jitter_p', '> 0', lambda p: p is None or p > 0),
                 'blur_sigma': ReadWhen('blur_p', '> 0', lambda p: p is None or p > 0),
                 'solarize_threshold': ReadWhen('solarize_p', '> 0', lambda p: p is None or p > 0)}

    def __init__(self,
                 size: Size,
                 scale: tuple[float, float] = (0.2, 1.0),
                 jitter: Sequence[float] = (0.4, 0.4, 0.4, 0.1),
                 jitter_p: float = 0.8,
                 grayscale_p: float = 0.2,
                 blur_p: float = 0.0,
                 blur_sigma: tuple[float, float] = (0.1, 2.0),
                 flip: bool = True,
                 solarize_p: float = 0.0,
                 solarize_threshold: float = 0.5) -> None:
        if len(jitter) != 4:
            raise ValueError(f'jitter must be (brightness, contrast, saturation, hue), got {jitter!r}')
        owner = type(self).__name__
        # A probability out of [0, 1] (or NaN, which compares False) would silently switch its
        # operation off or on for every view, on the CPU and on the device (built from params).
        for key, p in (('jitter_p', jitter_p), ('grayscale_p', grayscale_p), ('blur_p', blur_p),
                       ('solarize_p', solarize_p)):
            check_number(owner, key, p, low=0, high=1, hint='the share of views it is applied to')
        check_number(owner, 'solarize_threshold', solarize_threshold, low=0, high=1, low_open=True,
                     hint='solarize_threshold is on the [0, 1] scale of float images (0.5 = 128 of 255)')
        ops: list[v2.Transform] = [
            v2.RandomResizedCrop(size, scale=tuple(scale), antialias=True),
            v2.RandomApply([v2.ColorJitter(*jitter)], p=jitter_p),
            v2.RandomGrayscale(p=grayscale_p),
        ]
        if blur_p > 0:
            kernel = blur_kernel_size(size)
            ops.append(v2.RandomApply([v2.GaussianBlur(kernel, sigma=tuple(blur_sigma))], p=blur_p))
        if flip:
            ops.append(v2.RandomHorizontalFlip())
        ops += to_float_tensor()
        if solarize_p > 0:
            # On the float image, whatever the input type (a PIL threshold would be 0-255); it is per
            # pixel, so after the flip rather than before it (BYOL's order) gives the same image.
            ops.append(v2.RandomSolarize(solarize_threshold, p=solarize_p))
        super().__init__(ops)
        self.size, self.blur_p, self.solarize_p = size, blur_p, solarize_p
        # The resolved parameters, from which the device pipeline (ifnd.datasets.device_augment) is built.
        self.params = dict(size=size, scale=tuple(scale), ratio=(3 / 4, 4 / 3), jitter=tuple(jitter),
                           jitter_p=jitter_p, grayscale_p=grayscale_p, blur_p=blur_p,
                           blur_sigma=tuple(blur_sigma), blur_kernel=blur_kernel_size(size), flip=flip,
                           solarize_p=solarize_p, solarize_threshold=solarize_threshold)


@TRANSFORMS.register_module()
class SimCLRView(ContrastiveView):
    """SimCLR augmentation: strong colour jitter, scale (0.08, 1), blur on ImageNet-size crops."""

    read_when = {**ContrastiveView.read_when, 'strength': ContrastiveView.read_when['jitter']}

    def __init__(self,
                 size: Size,
                 strength: float = 1.0,
                 scale: tuple[float, float] = (0.08, 1.0),
                 jitter_p: float = 0.8,
                 grayscale_p: float = 0.2,
                 blur_p: float | None = None,
                 blur_sigma: tuple[float, float] = (0.1, 2.0),
                 flip: bool = True) -> None:
        s = strength
        if blur_p is None:
            blur_p = 0.5 if _min_side(size) >= LARGE_IMAGE_SIZE else 0.0
        super().__init__(size, scale, (0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s), jitter_p, grayscale_p, blur_p,
                         blur_sigma, flip)


@TRANSFORMS.register_module()
class MoCoV2View(ContrastiveView):
    """MoCo v2 augmentation: jitter (0.4, 0.4, 0.4, 0.1), scale (0.2, 1), blur on ImageNet-size crops."""

    def __init__(self,
                 size: Size,
                 scale: tuple[float, float] = (0.2, 1.0),
                 jitter: Sequence[float] = (0.4, 0.4, 0.4, 0.1),
                 jitter_p: float = 0.8,
                 grayscale_p: float = 0.2,
                 blur_p: float | None = None,
                 blur_sigma: tuple[float, float] = (0.1, 2.0),
                 flip: bool = True) -> None:
        if blur_p is None:
            blur_p = 0.5 if _min_side(size) >= LARGE_IMAGE_SIZE else 0.0
        super().__init__(size, scale, jitter, jitter_p, grayscale_p, blur_p, blur_sigma, flip)


@TRANSFORMS.register_module()
class EvalView(v2.Compose):
    """Deterministic evaluation view: resize the shorter side, then centre-crop."""

    def __init__(self, size: Size, resize: int | None = None) -> None:
        if resize is None:
            # The usual 0.875 crop ratio only makes sense for large images; small ones keep their size.
            min_side = _min_side(size)
            resize = int(min_side / 0.875) if min_side >= LARGE_IMAGE_SIZE else min_side
        super().__init__([v2.Resize(resize, antialias=True), v2.CenterCrop(size)] + to_float_tensor())
        self.size, self.resize = size, resize


@TRANSFORMS.register_module()
class MultiView:
    """Several independently drawn views of one image, returned as a list of tensors."""

    def __init__(self, transforms: PipelineCfg | Sequence[PipelineCfg], num_views: int | None = None) -> None:
        if isinstance(transforms, (list, tuple)):
            if num_views is not None and num_views != len(transforms):
                raise ValueError(f'MultiView got {len(transforms)} per-view transforms but num_views={num_views}')
            self.transforms = [build_pipeline(t) for t in transforms]
        else:
            num_views = 2 if num_views is None else num_views
            if num_views < 1:
                raise ValueError(f'num_views must be >= 1, got {num_views}')
            self.transforms = [build_pipeline(transforms)] * num_views
        self.num_views = len(self.transforms)

    def __call__(self, img: Any) -> list[torch.Tensor]:
        """Return ``num_views`` augmented views of ``img``."""
        return [t(img) for t in self.transforms]

    def __repr__(self) -> str:
        return f'{type(self).__name__}(num_views={self.num_views}, transforms={self.transforms})'
