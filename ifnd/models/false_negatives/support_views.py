"""FNC's detector (Huynh et al., WACV 2022): false negatives found through support views.

Each image comes with S extra views embedded without gradient; the other images of the batch
(over all ranks) are scored by the cosine of the anchor's support views with their two views,
aggregated by ``'mean'`` or ``'max'``; the ``top_k`` best-scored images, or those above
``threshold``, are flagged, both views alike.
"""
import dataclasses
from typing import Optional

import torch
from torch import Tensor

from ifnd.models.losses import TREATMENTS, check_treatment
from ifnd.registry import MODELS
from ifnd.settings import check_number, check_optional

from .detector import DetectorNeeds, FalseNegativeDetector, NegativeBatch


FNC_AGGREGATIONS = ('mean', 'max')


def check_fnc_options(treatment: str, top_k: Optional[int], threshold: Optional[float],
                      aggregation: str) -> None:
    """Refuse FNC settings that cannot work, naming the fix."""
    if treatment is None:
        raise ValueError(f"FNC needs a treatment, one of {TREATMENTS} (elimination or attraction of "
                         "what its support views flag); for no treatment use type='SimCLR'")
    check_treatment(treatment, 'FNC')
    check_fnc_selection(top_k, threshold, aggregation)


def check_fnc_selection(top_k: Optional[int], threshold: Optional[float],
                        aggregation: str) -> None:
    """Refuse an FNC aggregation or a choice of ``top_k`` / ``threshold`` that cannot work."""
    if aggregation not in FNC_AGGREGATIONS:
        raise ValueError(f'FNC aggregation must be one of {FNC_AGGREGATIONS}, got {aggregation!r}')
    if (top_k is None) == (threshold is None):
        raise ValueError(f'FNC needs exactly one of top_k and threshold, got top_k={top_k} and '
                         f'threshold={threshold}: set the other to None')
    check_optional('FNC', 'top_k', top_k, int, low=1, hint='false negatives per anchor image')
    check_optional('FNC', 'threshold', threshold, low=-1, high=1, high_open=True,
                   hint='a cosine similarity')


@torch.no_grad()
def fnc_false_negatives(support: Tensor,
                        candidate_views: Tensor,
                        own_index: Tensor,
                        top_k: Optional[int] = None,
                        threshold: Optional[float] = None,
                        aggregation: str = 'mean') -> Tensor:
    """FNC's false negatives ``[M, N]`` of M anchor images among N candidate images (boolean).

    ``support`` [M, S, D]: the anchor images' S support-view embeddings; ``candidate_views``
    [V, N, D]: the V views of each candidate image (all L2-normalised); ``own_index[m]``: anchor
    image m's own column (never flagged). The score of (m, n) aggregates cos(support, view) over
    the S × V pairs (``'mean'`` or ``'max'``), so both views of an image are flagged together;
    flagged are each row's ``top_k`` highest scores or the scores above ``threshold``.
    """
    check_fnc_selection(top_k, threshold, aggregation)
    if support.ndim != 3 or candidate_views.ndim != 3 or support.shape[2] != candidate_views.shape[2]:
        raise ValueError(f'support must be [M, S, D] and candidate_views [V, N, D], got '
                         f'{tuple(support.shape)} and {tuple(candidate_views.shape)}')
    (num, views, dim), size = support.shape, candidate_views.shape[1]
    if own_index.shape != (num, ):
        raise ValueError(f'own_index must have shape [{num}], got {tuple(own_index.shape)}')
    sims = (support.reshape(-1, dim) @ candidate_views.reshape(-1, dim).t()).view(
        num, views, candidate_views.shape[0], size)
    scores = sims.mean(dim=(1, 2)) if aggregation == 'mean' else sims.amax(dim=(1, 2))
    own = torch.arange(size, device=scores.device).unsqueeze(0) == own_index.to(scores.device).unsqueeze(1)
    if threshold is not None:
        return (scores > threshold) & ~own
    if top_k >= size - 1:
        raise ValueError(f'FNC top_k={top_k} would flag all {size - 1} other images of the batch '
                         f'(every negative): use top_k below {size - 1} or a larger batch')
    top = scores.masked_fill(own, float('-inf')).topk(top_k, dim=1).indices
    return torch.zeros_like(own).scatter_(1, top, True)


@MODELS.register_module()
class SupportViews(FalseNegativeDetector):
    """Flags each anchor image's ``top_k`` (or above-``threshold``) images by support views."""

    # Scores the two views of candidate images (MoCo's queued keys have one): the batch only.
    needs = DetectorNeeds(batch_only=True)

    def __init__(self, num_support_views: int = 2, top_k: int | None = 5,
                 threshold: float | None = None, aggregation: str = 'mean',
                 acceptance: dict | None = None) -> None:
        super().__init__(acceptance)
        check_fnc_selection(top_k, threshold, aggregation)
        check_number('FNC', 'num_support_views', num_support_views, int, low=1,
                     hint='the support views S it finds false negatives with; give the training '
                     'pipeline MultiView(num_views=2 + S)')
        self.needs = dataclasses.replace(self.needs, support_views=num_support_views)
        self.top_k, self.threshold, self.aggregation = top_k, threshold, aggregation
        self._flagged_per_image: torch.Tensor | None = None

    def flags(self, batch: NegativeBatch) -> torch.Tensor:
        """Image-wise flags ``[1, A, C]`` (both views of anchor and candidate images)."""
        dim = batch.candidates.shape[1]
        images = fnc_false_negatives(batch.support, batch.candidates.detach().view(2, -1, dim),
                                     batch.own_image, self.top_k, self.threshold, self.aggregation)
        self._flagged_per_image = images.sum(dim=1).float().mean()
        return images.repeat(2, 2).unsqueeze(0)

    def log_vars(self, batch: NegativeBatch) -> dict:
        """With a threshold: how many images it flags per anchor image."""
        logged = super().log_vars(batch)
        if self.threshold is not None and self._flagged_per_image is not None:
            logged['flagged'] = self._flagged_per_image
        return logged
