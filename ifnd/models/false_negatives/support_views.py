"""FNC's detector (Huynh et al., WACV 2022): false negatives found through support views.

Each image comes with S extra views embedded without gradient; the other images of the batch
(over all ranks) are scored by the cosine of the anchor's support views with their two views,
aggregated by ``'mean'`` or ``'max'``; the ``top_k`` best-scored images, or those above
``threshold``, are flagged, both views alike.
"""
import dataclasses

import torch

from ifnd.models.losses import check_fnc_selection, fnc_false_negatives
from ifnd.registry import MODELS

from .detector import DetectorNeeds, FalseNegativeDetector, NegativeBatch
from ifnd.settings import check_number


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
