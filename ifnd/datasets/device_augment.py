"""Contrastive views made in batches on the training device (the files are decoded there by :mod:`.decode`).

The view parameters are those the CPU views (:class:`~ifnd.datasets.transforms.ContrastiveView` and
its SimCLR / MoCo v2 presets) resolve from the same config dict, so one config describes both paths.

A batch's random numbers are drawn first, in one call (:meth:`DeviceViews.draw`: uniforms
``[views, B, num_draws]`` from torch's generator of the images' device, which the per-iteration
re-seeding covers); the views are then a pure function of the images and those numbers, one column
per random choice (the ``DRAW_*`` layout below). Each random step is computed for the whole batch and
kept per sample with ``torch.where``, so no step reads a device value on the host and
``torch.compile(fullgraph=True)`` traces the views whole (``roi_align`` included): on CUDA the data
preprocessor runs them compiled, a few kernels a batch. Steps that cannot change an image are not
computed: hue on grey images (which stay one channel until normalised), a step whose probability is 0.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
import torchvision  # noqa: F401 (registers torch.ops.torchvision.roi_align)
from torch import nn
from torch.nn import functional as F

from ifnd.device import CompileSetting, check_compile, compile_options, to_device

from .transforms import ContrastiveView, MultiView, PipelineCfg, build_pipeline

# Bytes of float32 pixels a padded batch of decoded images may take before it is cut in chunks.
PADDED_BATCH_BYTES = 1 << 30
_GREY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights

# The uniform draws of one view of one image, by column: torchvision's RandomResizedCrop tries up to
# CROP_ATTEMPTS (area, aspect) pairs, then offsets; the jitter's apply draw, order (4) and factors
# (brightness, contrast, saturation, hue); grayscale; the blur's sigma and apply draw; the flip; the
# solarisation's apply draw (last, though applied before the flip, so the other columns keep their places).
CROP_ATTEMPTS = 10
DRAW_AREA = slice(0, CROP_ATTEMPTS)
DRAW_ASPECT = slice(CROP_ATTEMPTS, 2 * CROP_ATTEMPTS)
DRAW_OFFSET = slice(2 * CROP_ATTEMPTS, 2 * CROP_ATTEMPTS + 2)  # top, left
DRAW_CROP = slice(0, 2 * CROP_ATTEMPTS + 2)
DRAW_JITTER = 2 * CROP_ATTEMPTS + 2
DRAW_ORDER = slice(DRAW_JITTER + 1, DRAW_JITTER + 5)
DRAW_FACTORS = slice(DRAW_JITTER + 5, DRAW_JITTER + 9)
DRAW_GRAYSCALE = DRAW_JITTER + 9
DRAW_SIGMA = DRAW_JITTER + 10
DRAW_BLUR = DRAW_JITTER + 11
DRAW_FLIP = DRAW_JITTER + 12
DRAW_SOLARIZE = DRAW_JITTER + 13
NUM_DRAWS = DRAW_SOLARIZE + 1


def draw_width(solarize: bool) -> int:
    """Uniforms a view takes: the last column only where it solarises."""
    # Without solarisation the draws keep their former width, so the views of every run made
    # before solarisation existed are drawn again exactly (same seeds, same images).
    return NUM_DRAWS if solarize else DRAW_SOLARIZE


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
                 draws: torch.Tensor | None = None) -> torch.Tensor:
    """Crop boxes ``[B, 4]`` (top, left, height, width; float) drawn as torchvision's RandomResizedCrop, per image.

    ``draws``: uniforms ``[B, 2 * CROP_ATTEMPTS + 2]`` (the ``DRAW_CROP`` columns; None draws them).
    torchvision tries up to ``CROP_ATTEMPTS`` (area, aspect) draws and takes the first that fits, else a
    centre crop at the clamped aspect ratio; here all attempts are computed at once and the first fitting
    one is picked with ``argmax``, so nothing is read back on the host.
    """
    H, W = heights.float().unsqueeze(1), widths.float().unsqueeze(1)
    if draws is None:
        draws = torch.rand(H.shape[0], DRAW_CROP.stop, device=heights.device)
    lo, hi = float(scale[0]), float(scale[1])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    area = H * W * (lo + (hi - lo) * draws[:, DRAW_AREA])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * draws[:, DRAW_ASPECT])
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
    u = draws[:, DRAW_OFFSET]
    # Uniform integer offsets as torchvision's randint; the minimum guards u * n rounding up to n in float32.
    top = torch.minimum(torch.floor(u[:, 0] * (H - h + 1)), H - h)
    left = torch.minimum(torch.floor(u[:, 1] * (W - w + 1)), W - w)
    top = torch.where(found, top, torch.div(H - h, 2, rounding_mode='floor'))
    left = torch.where(found, left, torch.div(W - w, 2, rounding_mode='floor'))
    return torch.stack([top, left, h, w], 1)


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Crop ``boxes`` (top, left, h, w) of ``images`` ``[B, C, H, W]`` (float) resized to ``size``, in one op.

    ``roi_align`` averages bilinear samples over each output pixel's footprint (about ceil(crop / size)
    per side), so downscaled crops are antialiased like torchvision's ``resized_crop(antialias=True)``.
    The operator is called directly: torchvision's wrapper swaps in a Python version on CUDA under
    deterministic algorithms (for its backward; the forward is deterministic) and is not traced whole.
    """
    top, left, h, w = boxes.unbind(1)
    index = torch.arange(boxes.shape[0], device=boxes.device, dtype=boxes.dtype)
    rois = torch.stack([index, left, top, left + w, top + h], 1).to(images.dtype)
    return torch.ops.torchvision.roi_align(images, rois, 1.0, size[0], size[1], -1, True)


def grey(x: torch.Tensor) -> torch.Tensor:
    """Luma ``[B, 1, H, W]`` of RGB ``[B, 3, H, W]`` with torchvision's weights (of a grey ``[B, 1, H, W]``:
    what the RGB formula gives for equal channels, to the bit)."""
    r, g, b = x.unbind(1) if x.shape[1] == 3 else (x[:, 0],) * 3
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


def solarize(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """torchvision's solarisation of float images: the pixels >= ``threshold`` inverted."""
    return torch.where(x >= threshold, 1 - x, x)


class DeviceView(nn.Module):
    """One random view of a batch: crop, colour jitter, grayscale, blur, solarisation and flip, each drawn per
    sample."""

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
        self.solarize_p, self.solarize_threshold = float(p['solarize_p']), float(p['solarize_threshold'])
        self.num_draws = draw_width(self.solarize_p > 0)
        self.flip = bool(p['flip'])

    def forward(self, images: torch.Tensor, draws: torch.Tensor | None = None) -> torch.Tensor:
        """Views ``[B, 3, h, w]`` (float32 in [0, 1]) of same-size images ``[B, C, H, W]`` (uint8 or float),
        from the uniforms ``draws`` ``[B, num_draws]`` (None: drawn here)."""
        x = to_float(images)
        n, _, H, W = x.shape
        if draws is None:
            draws = torch.rand(n, self.num_draws, device=x.device)
        boxes = sample_crops(torch.full((n,), H, device=x.device), torch.full((n,), W, device=x.device),
                             self.scale, self.ratio, draws[:, DRAW_CROP])
        return to_rgb(self.colour(resized_crops(x, boxes, self.size), draws))

    def colour(self, x: torch.Tensor, draws: torch.Tensor | None = None) -> torch.Tensor:
        """The colour and flip steps on crops ``[B, C, h, w]`` in [0, 1], RGB or grey (C = 1, kept grey)."""
        n, device = x.shape[0], x.device
        if draws is None:
            draws = torch.rand(n, self.num_draws, device=device)
        if self.jitter_p > 0 and any(rng for _, rng in self.jitter):
            x = torch.where(_per_sample(draws[:, DRAW_JITTER] < self.jitter_p), self._jitter(x, draws), x)
        if self.grayscale_p > 0:
            x = torch.where(_per_sample(draws[:, DRAW_GRAYSCALE] < self.grayscale_p), grey(x).expand_as(x), x)
        if self.blur_p > 0:
            lo, hi = self.blur_sigma
            sigma = lo + (hi - lo) * draws[:, DRAW_SIGMA]
            x = torch.where(_per_sample(draws[:, DRAW_BLUR] < self.blur_p),
                            gaussian_blur(x, self.blur_kernel, sigma), x)
        if self.solarize_p > 0:
            x = torch.where(_per_sample(draws[:, DRAW_SOLARIZE] < self.solarize_p),
                            solarize(x, self.solarize_threshold), x)
        if self.flip:
            x = torch.where(_per_sample(draws[:, DRAW_FLIP] < 0.5), x.flip(-1), x)
        return x

    def _factors(self, draws: torch.Tensor) -> torch.Tensor:
        """Per sample, the brightness, contrast, saturation and hue factors ``[B, 4]``."""
        neutral = (1.0, 1.0, 1.0, 0.0)  # a step left out of the config leaves the image as it is
        u = draws[:, DRAW_FACTORS]
        return torch.stack([rng[0] + (rng[1] - rng[0]) * u[:, j] if rng else torch.full_like(u[:, j], neutral[j])
                            for j, (_, rng) in enumerate(self.jitter)], 1)

    def _jitter(self, x: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        # torchvision applies the four adjustments in a random order, per sample here. Brightness, contrast
        # and saturation are all blends f x + (1 - f) target (target 0, the mean luma, the luma image), so
        # one blend per slot with a per-sample factor and target does any of them. The hue shift is computed
        # once: the slots before each sample's hue slot blend (the others pass the image through, f = 1),
        # then the hue shift, then the slots after it. Hue leaves grey images as they are: not computed.
        order = draws[:, DRAW_ORDER].argsort(1)  # the step at each slot
        factors = self._factors(draws)
        blend = torch.cat([factors[:, :3], torch.ones_like(factors[:, 3:])], 1)  # the hue step blends nothing
        if self.jitter[3][1] is None or x.shape[1] == 1:
            for slot in range(4):
                x = _blend(x, order[:, slot], blend)
            return x
        hue_slot = (order == 3).to(torch.uint8).argmax(1)
        for slot in range(3):
            x = _blend(x, order[:, slot], blend, slot < hue_slot)
        x = adjust_hue(x, factors[:, 3])
        for slot in range(1, 4):
            x = _blend(x, order[:, slot], blend, slot > hue_slot)
        return x


def _blend(x: torch.Tensor, step: torch.Tensor, factors: torch.Tensor, active: torch.Tensor | None = None
           ) -> torch.Tensor:
    """Each sample's brightness (step 0), contrast (1) or saturation (2) blend; where not ``active``, or
    for step 3, the factor is 1 and the image passes through unchanged, to the bit."""
    luma = grey(x)
    target = torch.where(_per_sample(step == 0), 0.0,
                         torch.where(_per_sample(step == 1), luma.mean((1, 2, 3), keepdim=True), luma))
    f = factors.gather(1, step.unsqueeze(1)).squeeze(1)
    if active is not None:
        f = torch.where(active, f, 1.0)
    f = _per_sample(f)
    return (f * x + (1 - f) * target).clamp_(0, 1)


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


def padded_batch(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Images ``[C, H, W]`` (uint8) of different sizes as one float32 batch ``[B, C, Hmax, Wmax]`` in [0, 1].

    Each image is copied once into one uint8 buffer, its edges replicated into the padding by one
    gather (roi_align's bilinear samples at a crop's last half pixel read the next row and column,
    which must repeat the edge as torchvision's crops do), and the whole batch converted once.
    """
    channels = {img.shape[0] for img in images}
    if len(channels) != 1:
        raise ValueError(f'Images of one batch must have the same number of channels, got {sorted(channels)}')
    device = images[0].device
    hmax = max(img.shape[-2] for img in images)
    wmax = max(img.shape[-1] for img in images)
    buffer = images[0].new_empty((len(images), channels.pop(), hmax, wmax))  # every pixel is written
    for i, img in enumerate(images):
        buffer[i, :, :img.shape[-2], :img.shape[-1]] = img
    if any(img.shape[-2:] != (hmax, wmax) for img in images):
        sizes = torch.tensor([img.shape[-2:] for img in images])
        sizes = to_device(sizes, device)
        rows = torch.minimum(torch.arange(hmax, device=device), sizes[:, :1] - 1)  # [B, Hmax]
        cols = torch.minimum(torch.arange(wmax, device=device), sizes[:, 1:] - 1)  # [B, Wmax]
        batch = torch.arange(len(images), device=device).view(-1, 1, 1)
        buffer = buffer.permute(0, 2, 3, 1)[batch, rows.unsqueeze(2), cols.unsqueeze(1)].permute(0, 3, 1, 2)
    return to_float(buffer.contiguous())


def to_float(images: torch.Tensor) -> torch.Tensor:
    """A uint8 or float batch as float32 in [0, 1]."""
    if images.dtype == torch.uint8:
        return images.float().div_(255)
    return images.float()


def to_rgb(images: torch.Tensor) -> torch.Tensor:
    """A float batch ``[B, 1 or 3, H, W]`` as RGB ``[B, 3, H, W]`` (grey: the channel expanded, not copied)."""
    if images.shape[1] == 1:
        return images.expand(-1, 3, -1, -1)
    if images.shape[1] != 3:
        raise ValueError(f'Images must have 1 or 3 channels, got a batch of shape {tuple(images.shape)}')
    return images


def to_float_rgb(images: torch.Tensor) -> torch.Tensor:
    """A uint8 or float batch ``[B, 1 or 3, H, W]`` as float32 RGB in [0, 1]."""
    return to_rgb(to_float(images)).contiguous()


def _normalised(views: list[torch.Tensor], mean: torch.Tensor | None, std: torch.Tensor | None
                ) -> list[torch.Tensor]:
    if mean is None:
        return views
    return [(v - mean) / std for v in views]


class DeviceViews(nn.Module):
    """All views of a batch (one :class:`DeviceView` per view of the pipeline), made on the images' device.

    ``compile``: ``torch.compile`` options for the views (None: eager; see ``compile_options``).
    Same-size batches are compiled whole, from the uint8 images to the normalised views; images of
    different sizes are padded and cropped eagerly (their shapes vary), and their colour steps and
    normalisation compiled.
    """

    def __init__(self, pipeline: PipelineCfg, compile: dict | None = None) -> None:
        super().__init__()
        views = device_views_of(pipeline)
        if views is None:
            raise ValueError(f'Device augmentation needs a ContrastiveView-type pipeline (e.g. MoCoV2View, SimCLRView) '
                             f'or a MultiView of them, got {pipeline!r}; use augment_on=\'cpu\' for other pipelines')
        # A view config repeated num_views times gives independent draws from one module.
        self.views = nn.ModuleList([DeviceView(v) for v in views])
        self.num_draws = max(view.num_draws for view in self.views)
        self.compile_options = compile
        self._same_size, self._coloured = self._same_size_views, self._coloured_views
        if compile is not None:
            options = {'fullgraph': True, **compile}
            self._same_size = torch.compile(self._same_size_views, **options)
            self._coloured = torch.compile(self._coloured_views, **options)

    def draw(self, num: int, device: torch.device | str) -> torch.Tensor:
        """The uniforms ``[views, num, draws]`` of a batch of ``num`` images, in one call."""
        return torch.rand(len(self.views), num, self.num_draws, device=device)

    def forward(self, images: torch.Tensor | Sequence[torch.Tensor], draws: torch.Tensor | None = None,
                mean: torch.Tensor | None = None, std: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Views of a uint8 batch ``[B, C, H, W]``, or of a list of ``[C, H, W]`` images of any sizes, from
        ``draws`` (:meth:`draw`; None: drawn here); normalised by ``mean`` and ``std`` ``[3, 1, 1]`` if given."""
        same_size = isinstance(images, torch.Tensor)
        device = images.device if same_size else images[0].device
        if draws is None:
            draws = self.draw(len(images), device)
        if same_size:
            return self._same_size(images, draws, mean, std)
        return self._coloured(self._crops_of_list(images, draws), draws, mean, std)

    def _same_size_views(self, images: torch.Tensor, draws: torch.Tensor, mean: torch.Tensor | None,
                         std: torch.Tensor | None) -> list[torch.Tensor]:
        x = to_float(images)
        return _normalised([view(x, d) for view, d in zip(self.views, draws)], mean, std)

    def _coloured_views(self, crops: list[torch.Tensor], draws: torch.Tensor, mean: torch.Tensor | None,
                        std: torch.Tensor | None) -> list[torch.Tensor]:
        return _normalised([to_rgb(view.colour(c, d)) for view, c, d in zip(self.views, crops, draws)], mean, std)

    def _crops_of_list(self, images: Sequence[torch.Tensor], draws: torch.Tensor) -> list[torch.Tensor]:
        """Each view's crops ``[B, C, h, w]`` of images of different sizes: padded and converted once for all
        views (in chunks of at most ``PADDED_BATCH_BYTES``), cropped together."""
        device = images[0].device
        sizes = torch.tensor([img.shape[-2:] for img in images], dtype=torch.float32)
        sizes = to_device(sizes, device)
        chunks = _padded_chunks(images)
        padded = [padded_batch([images[i] for i in chunk]) for chunk in chunks]
        order = [i for chunk in chunks for i in chunk]
        rows = [to_device(torch.tensor(chunk), device) for chunk in chunks]
        inverse = None
        if order != list(range(len(images))):
            inverse = torch.empty(len(order), dtype=torch.long)
            inverse[torch.tensor(order)] = torch.arange(len(order))
            inverse = to_device(inverse, device)
        crops = []
        for view, d in zip(self.views, draws):
            boxes = sample_crops(sizes[:, 0], sizes[:, 1], view.scale, view.ratio, d[:, DRAW_CROP])
            out = [resized_crops(batch, boxes.index_select(0, r), view.size) for batch, r in zip(padded, rows)]
            out = torch.cat(out) if len(out) > 1 else out[0]
            crops.append(out if inverse is None else out.index_select(0, inverse))
        return crops


class DeviceAugmentCache:
    """The :class:`DeviceViews` of each pipeline config met in batches, built once and kept on a device."""

    def __init__(self, compile: CompileSetting = False) -> None:
        check_compile(compile, 'the device views\' compile')  # fails when built, not at the first batch
        self.compile = compile
        self._built: dict[str, DeviceViews] = {}

    def get(self, pipeline: PipelineCfg, device: torch.device) -> DeviceViews:
        """The views module of ``pipeline`` on ``device``."""
        key = f'{device}|{pipeline!r}'
        views = self._built.get(key)
        if views is None:
            options = compile_options(self.compile, device)
            views = self._built[key] = DeviceViews(copy.deepcopy(pipeline), options).to(device)
        return views
