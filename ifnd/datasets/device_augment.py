"""Contrastive views made in batches on the training device (the files are decoded there by :mod:`.decode`).

The view parameters are those the CPU views (:class:`~ifnd.datasets.transforms.ContrastiveView` and
its SimCLR / MoCo v2 presets) resolve from the same config dict, so one config describes both paths.
Every random draw is per sample, made on the images' device from torch's default generator of that
device (which the per-iteration re-seeding covers), and no step reads a device value on the host:
each random step is computed for the whole batch and kept per sample with ``torch.where``, so the
views never stall the device stream.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import roi_align

from .transforms import ContrastiveView, MultiView, PipelineCfg, build_pipeline

# Bytes of float32 pixels a padded batch of decoded images may take before it is cut in chunks.
PADDED_BATCH_BYTES = 1 << 30
_GREY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


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


def sample_crops(heights: torch.Tensor, widths: torch.Tensor, scale: Sequence[float], ratio: Sequence[float],
                 attempts: int = 10) -> torch.Tensor:
    """Crop boxes ``[B, 4]`` (top, left, height, width; float) drawn as torchvision's RandomResizedCrop, per image.

    torchvision tries up to ``attempts`` (area, aspect) draws and takes the first that fits, else a centre
    crop at the clamped aspect ratio; here all attempts are drawn at once and the first fitting one is
    picked with ``argmax``, so nothing is read back on the host.
    """
    device = heights.device
    H, W = heights.float().unsqueeze(1), widths.float().unsqueeze(1)
    n = H.shape[0]
    lo, hi = float(scale[0]), float(scale[1])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    area = H * W * (lo + (hi - lo) * torch.rand(n, attempts, device=device))
    aspect = torch.exp(log_lo + (log_hi - log_lo) * torch.rand(n, attempts, device=device))
    w = torch.round(torch.sqrt(area * aspect))
    h = torch.round(torch.sqrt(area / aspect))
    fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)
    first = fits.to(torch.uint8).argmax(1, keepdim=True)  # argmax gives the first maximum
    found = fits.any(1)
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    H, W = H.squeeze(1), W.squeeze(1)
    in_ratio = W / H
    too_tall, too_wide = in_ratio < min(ratio), in_ratio > max(ratio)
    fw = torch.where(too_wide, torch.round(H * max(ratio)), W)
    fh = torch.where(too_tall, torch.round(W / min(ratio)), H)
    w, h = torch.where(found, w, fw), torch.where(found, h, fh)
    u = torch.rand(2, n, device=device)
    # Uniform integer offsets as torchvision's randint; the minimum guards u * n rounding up to n in float32.
    top = torch.minimum(torch.floor(u[0] * (H - h + 1)), H - h)
    left = torch.minimum(torch.floor(u[1] * (W - w + 1)), W - w)
    top = torch.where(found, top, torch.div(H - h, 2, rounding_mode='floor'))
    left = torch.where(found, left, torch.div(W - w, 2, rounding_mode='floor'))
    return torch.stack([top, left, h, w], 1)


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int],
                  sampling_ratio: int = -1) -> torch.Tensor:
    """Crop ``boxes`` (top, left, h, w) of ``images`` ``[B, C, H, W]`` (float) resized to ``size``, in one op.

    ``roi_align`` averages bilinear samples over each output pixel's footprint (about ceil(crop / size)
    per side), so downscaled crops are antialiased like torchvision's ``resized_crop(antialias=True)``.
    """
    top, left, h, w = boxes.unbind(1)
    index = torch.arange(boxes.shape[0], device=boxes.device, dtype=boxes.dtype)
    rois = torch.stack([index, left, top, left + w, top + h], 1).to(images.dtype)
    return roi_align(images, rois, size, spatial_scale=1.0, sampling_ratio=sampling_ratio, aligned=True)


def _sampling_ratio(images: torch.Tensor, size: tuple[int, int]) -> int:
    # On CUDA with deterministic algorithms torchvision falls back to a Python roi_align that, with an
    # adaptive ratio, samples every input pixel per bin; a fixed ratio from the (host-known) image size
    # bounds it.
    if torch.are_deterministic_algorithms_enabled() and images.device.type != 'cpu':
        return max(1, math.ceil(max(images.shape[-2] / size[0], images.shape[-1] / size[1])))
    return -1


def grey(x: torch.Tensor) -> torch.Tensor:
    """Luma ``[B, 1, H, W]`` of RGB ``[B, 3, H, W]`` with torchvision's weights."""
    r, g, b = x.unbind(1)
    return (_GREY[0] * r + _GREY[1] * g + _GREY[2] * b).unsqueeze(1)


def _per_sample(f: torch.Tensor) -> torch.Tensor:
    return f.view(-1, 1, 1, 1)


def adjust_brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's brightness with a factor per sample (``f`` ``[B]``)."""
    return (x * _per_sample(f)).clamp_(0, 1)


def adjust_contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's contrast with a factor per sample: blend with the mean luma."""
    f = _per_sample(f)
    return (f * x + (1 - f) * grey(x).mean((1, 2, 3), keepdim=True)).clamp_(0, 1)


def adjust_saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's saturation with a factor per sample: blend with the luma image."""
    f = _per_sample(f)
    return (f * x + (1 - f) * grey(x)).clamp_(0, 1)


def adjust_hue(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's hue shift with a shift per sample (``f`` in [-0.5, 0.5]): through HSV and back."""
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    chroma = maxc - minc
    flat = chroma == 0
    safe = torch.where(flat, torch.ones_like(chroma), chroma)
    sat = torch.where(maxc > 0, chroma / torch.where(maxc > 0, maxc, torch.ones_like(maxc)), torch.zeros_like(maxc))
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    hue = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2 + rc - bc, 4 + gc - rc))
    hue = torch.where(flat, torch.zeros_like(hue), hue)
    hue = torch.remainder(hue / 6 + f.view(-1, 1, 1), 1.0)
    # HSV to RGB: channel n is v - v s clamp(min(k, 4 - k), 0, 1) with k = (n + 6 h) mod 6, n = 5, 3, 1.
    out = []
    for n in (5, 3, 1):
        k = torch.remainder(n + 6 * hue, 6)
        out.append(maxc - maxc * sat * torch.minimum(k, 4 - k).clamp(0, 1))
    return torch.stack(out, 1).clamp_(0, 1)


def gaussian_blur(x: torch.Tensor, kernel_size: int, sigma: torch.Tensor) -> torch.Tensor:
    """torchvision's Gaussian blur (reflect padding) with a sigma per sample, as two grouped 1-D convolutions."""
    B, C, H, W = x.shape
    t = torch.arange(kernel_size, device=x.device, dtype=x.dtype) - (kernel_size - 1) / 2
    kernel = torch.softmax(-t.square() / (2 * sigma.to(x.dtype).square().unsqueeze(1)), 1)  # [B, k], sums to 1
    kernel = kernel.repeat_interleave(C, 0)
    pad = kernel_size // 2
    y = F.pad(x.reshape(1, B * C, H, W), (pad, pad, pad, pad), mode='reflect')
    y = F.conv2d(y, kernel.view(B * C, 1, 1, kernel_size), groups=B * C)
    y = F.conv2d(y, kernel.view(B * C, 1, kernel_size, 1), groups=B * C)
    return y.view(B, C, H, W)


class DeviceView(nn.Module):
    """One random view of a batch: crop, colour jitter, grayscale, blur and flip, each drawn per sample."""

    def __init__(self, view: ContrastiveView) -> None:
        super().__init__()
        p = view.params
        self.size = _pair(p['size'])
        self.scale, self.ratio = tuple(p['scale']), tuple(p['ratio'])
        b, c, s, h = (float(v) for v in p['jitter'])
        # torchvision's ColorJitter ranges; a zero strength leaves its step out (it still shuffles four slots).
        self.jitter = [(adjust_brightness, (max(0.0, 1 - b), 1 + b) if b else None),
                       (adjust_contrast, (max(0.0, 1 - c), 1 + c) if c else None),
                       (adjust_saturation, (max(0.0, 1 - s), 1 + s) if s else None),
                       (adjust_hue, (-h, h) if h else None)]
        self.jitter_p, self.grayscale_p = float(p['jitter_p']), float(p['grayscale_p'])
        self.blur_p, self.blur_sigma, self.blur_kernel = float(p['blur_p']), tuple(p['blur_sigma']), p['blur_kernel']
        self.flip = bool(p['flip'])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Views ``[B, 3, h, w]`` (float32 in [0, 1]) of same-size images ``[B, C, H, W]`` (uint8 or float)."""
        x = to_float(images)
        n, _, H, W = x.shape
        boxes = sample_crops(torch.full((n,), H, device=x.device), torch.full((n,), W, device=x.device),
                             self.scale, self.ratio)
        return self.colour(to_rgb(resized_crops(x, boxes, self.size, _sampling_ratio(x, self.size))))

    def from_list(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Views of images ``[C, H, W]`` of different sizes: padded into batches, cropped together, then coloured."""
        device = images[0].device
        sizes = torch.tensor([img.shape[-2:] for img in images], dtype=torch.float32)
        # non_blocking: a host-to-device copy that never waits for the device.
        sizes = sizes.to(device, non_blocking=True)
        boxes = sample_crops(sizes[:, 0], sizes[:, 1], self.scale, self.ratio)
        crops = []
        for chunk in _padded_chunks(images):
            batch = _pad_batch([images[i] for i in chunk])
            rows = torch.tensor(chunk).to(device, non_blocking=True)
            crops.append(resized_crops(batch, boxes.index_select(0, rows), self.size,
                                       _sampling_ratio(batch, self.size)))
        out = torch.cat(crops) if len(crops) > 1 else crops[0]
        order = [i for chunk in _padded_chunks(images) for i in chunk]
        if order != list(range(len(images))):
            inverse = torch.empty(len(order), dtype=torch.long)
            inverse[torch.tensor(order)] = torch.arange(len(order))
            out = out.index_select(0, inverse.to(device, non_blocking=True))
        return self.colour(to_rgb(out))

    def colour(self, x: torch.Tensor) -> torch.Tensor:
        """The colour and flip steps on RGB crops ``[B, 3, h, w]`` in [0, 1]."""
        n, device = x.shape[0], x.device
        x = torch.where(_per_sample(torch.rand(n, device=device) < self.jitter_p), self._jitter(x), x)
        x = torch.where(_per_sample(torch.rand(n, device=device) < self.grayscale_p), grey(x).expand_as(x), x)
        if self.blur_p > 0:
            lo, hi = self.blur_sigma
            sigma = lo + (hi - lo) * torch.rand(n, device=device)
            blurred = gaussian_blur(x, self.blur_kernel, sigma)
            x = torch.where(_per_sample(torch.rand(n, device=device) < self.blur_p), blurred, x)
        if self.flip:
            x = torch.where(_per_sample(torch.rand(n, device=device) < 0.5), x.flip(-1), x)
        return x

    def _jitter(self, x: torch.Tensor) -> torch.Tensor:
        # torchvision applies the four adjustments in a random order; per sample here: slot k applies the
        # adjustment that sample's permutation puts there. Brightness, contrast and saturation are all
        # blends f x + (1 - f) target (target 0, the mean luma, the luma image), so one blend per slot
        # with a per-sample factor and target does any of them; hue is computed per slot and selected.
        n, device = x.shape[0], x.device
        order = torch.rand(n, 4, device=device).argsort(1)
        neutral = (1.0, 1.0, 1.0, 0.0)  # a step left out of the config leaves the image as it is
        factors = torch.stack([rng[0] + (rng[1] - rng[0]) * torch.rand(n, device=device) if rng
                               else torch.full((n,), neutral[j], device=device)
                               for j, (_, rng) in enumerate(self.jitter)], 1)
        # The hue slot's blend factor is 1 (identity): the hue shift is applied by adjust_hue alone.
        blend = torch.cat([factors[:, :3], torch.ones(n, 1, device=device)], 1)
        for slot in range(4):
            op = order[:, slot]
            luma = grey(x)
            target = torch.where(_per_sample(op == 0), 0.0,
                                 torch.where(_per_sample(op == 1), luma.mean((1, 2, 3), keepdim=True), luma))
            f = _per_sample(blend.gather(1, op.unsqueeze(1)).squeeze(1))
            y = (f * x + (1 - f) * target).clamp_(0, 1)
            if self.jitter[3][1] is not None:
                y = torch.where(_per_sample(op == 3), adjust_hue(x, factors[:, 3]), y)
            x = y
        return x


def _padded_chunks(images: Sequence[torch.Tensor]) -> list[list[int]]:
    # Images sorted by size, cut where the padded float batch would pass PADDED_BATCH_BYTES, so a few
    # very large files do not make every image of the batch as large.
    order = sorted(range(len(images)), key=lambda i: (images[i].shape[-2] * images[i].shape[-1], i))
    chunks: list[list[int]] = [[]]
    hmax = wmax = 0
    for i in order:
        c, h, w = images[i].shape
        nh, nw = max(hmax, h), max(wmax, w)
        if chunks[-1] and (len(chunks[-1]) + 1) * c * nh * nw * 4 > PADDED_BATCH_BYTES:
            chunks.append([])
            nh, nw = h, w
        chunks[-1].append(i)
        hmax, wmax = nh, nw
    return chunks


def _pad_batch(images: Sequence[torch.Tensor]) -> torch.Tensor:
    # Edge-replicating pads: roi_align's bilinear samples at a crop's last half pixel read the next row
    # and column, which must repeat the edge as torchvision's crops do, not be zeros.
    hmax = max(img.shape[-2] for img in images)
    wmax = max(img.shape[-1] for img in images)
    padded = [F.pad(to_float(img.unsqueeze(0)), (0, wmax - img.shape[-1], 0, hmax - img.shape[-2]),
                    mode='replicate') if img.shape[-2:] != (hmax, wmax) else to_float(img.unsqueeze(0))
              for img in images]
    return torch.cat(padded)


def to_float(images: torch.Tensor) -> torch.Tensor:
    """A uint8 or float batch as float32 in [0, 1]."""
    if images.dtype == torch.uint8:
        return images.float().div_(255)
    return images.float()


def to_rgb(images: torch.Tensor) -> torch.Tensor:
    """A float batch ``[B, 1 or 3, H, W]`` as RGB ``[B, 3, H, W]``."""
    if images.shape[1] == 1:
        return images.expand(-1, 3, -1, -1).contiguous()
    if images.shape[1] != 3:
        raise ValueError(f'Images must have 1 or 3 channels, got a batch of shape {tuple(images.shape)}')
    return images


def to_float_rgb(images: torch.Tensor) -> torch.Tensor:
    """A uint8 or float batch ``[B, 1 or 3, H, W]`` as float32 RGB in [0, 1]."""
    return to_rgb(to_float(images))


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


class DeviceAugmentCache:
    """The :class:`DeviceViews` of each pipeline config met in batches, built once and kept on a device."""

    def __init__(self) -> None:
        self._built: dict[str, DeviceViews] = {}

    def get(self, pipeline: PipelineCfg, device: torch.device) -> DeviceViews:
        """The views module of ``pipeline`` on ``device``."""
        key = f'{device}|{pipeline!r}'
        views = self._built.get(key)
        if views is None:
            views = self._built[key] = DeviceViews(copy.deepcopy(pipeline)).to(device)
        return views
