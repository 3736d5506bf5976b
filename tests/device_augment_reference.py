"""The device views as they were drawn before the views took their random numbers in one draw: the
reference the statistical and pixel tests of tests/test_device_augment.py compare the views against.

Each random step draws from torch's generator of the images' device in this order: the crop's areas
``[n, 10]``, aspect ratios ``[n, 10]`` and offsets ``[2, n]``; then the jitter's apply draw ``[n]``,
its order ``[n, 4]`` and its four factors ``[n]`` each (a step left out of the view draws nothing),
the grayscale draw ``[n]``, the blur's sigma and apply draws ``[n]`` (with blur on), the solarisation's
apply draw ``[n]`` (with solarisation on), the flip ``[n]``.
"""
from collections.abc import Sequence

import torch
from torchvision.ops import roi_align

from ifnd.datasets import device_augment
from ifnd.datasets.device_augment import adjust_hue, gaussian_blur, grey, to_float, to_rgb


def _per_sample(f: torch.Tensor) -> torch.Tensor:
    return f.view(-1, 1, 1, 1)


def sample_crops(heights: torch.Tensor, widths: torch.Tensor, scale: Sequence[float], ratio: Sequence[float],
                 attempts: int = 10) -> torch.Tensor:
    """Crop boxes ``[B, 4]`` as RandomResizedCrop draws them, from the areas ``[B, attempts]``, aspect
    ratios ``[B, attempts]`` and offsets ``[2, B]`` drawn here one after the other (the boxes'
    arithmetic is the current one's)."""
    n, device = heights.shape[0], heights.device
    area, aspect = torch.rand(n, attempts, device=device), torch.rand(n, attempts, device=device)
    offsets = torch.rand(2, n, device=device)
    return device_augment.sample_crops(heights, widths, scale, ratio, torch.cat([area, aspect, offsets.t()], 1))


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


class DeviceView(device_augment.DeviceView):
    """One random view of a batch, each step drawing its own random numbers as it goes (the view's
    parameters are read as the current ``DeviceView`` reads them)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Views ``[B, 3, h, w]`` (float32 in [0, 1]) of same-size images ``[B, C, H, W]`` (uint8 or float)."""
        x = to_float(images)
        n, _, H, W = x.shape
        boxes = sample_crops(torch.full((n,), H, device=x.device), torch.full((n,), W, device=x.device),
                             self.scale, self.ratio)
        return self.colour(to_rgb(resized_crops(x, boxes, self.size)))

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
        if self.solarize_p > 0:
            inverted = torch.where(x >= self.solarize_threshold, 1 - x, x)
            x = torch.where(_per_sample(torch.rand(n, device=device) < self.solarize_p), inverted, x)
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
