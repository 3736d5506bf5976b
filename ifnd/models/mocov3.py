"""MoCo v3 (Chen, Xie and He, ICCV 2021): a momentum key encoder and the batch's keys, no queue.

The base encoder (backbone f, projection g, prediction head h) gives queries q = h(g(f(x))), the
momentum encoder (f, g) keys k; the loss is symmetric over the two views,
``ctr(q1, k2) + ctr(q2, k1)`` with ``ctr(q, k) = 2τ · CE(q·kᵀ/τ, own key)`` over the keys of the
batch gathered across processes. The momentum follows a half cosine from ``momentum`` (m₀) to 1
over the run's iterations: m_t = 1 − (1 − m₀)(cos(π t / T) + 1) / 2, t and T set before each
iteration by ``MomentumScheduleHook``.

For the false-negative parts the step is laid out as SimCLR's (``contrastive.py``): anchors are
the 2M local queries ``cat([q1, q2])``, candidates the keys of all processes ``cat([k1s, k2s])``;
a query's candidates are the keys of the other view (its positive: its own image's), the keys
of its own view are no candidates. So every detector (pseudo labels, support views, GloFND,
ground truth), treatment and weighting works on it unchanged, with flags ``[L, 2M, 2T]``.
"""
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ifnd.dist import gather_no_grad
from ifnd.models.contrastive import ContrastiveAlgorithm
from ifnd.models.false_negatives import NegativeBatch
from ifnd.models.moco import KeyEncoder
from ifnd.registry import MODELS
from ifnd.settings import check_number

# MoCo v3's prediction head for ViT: 2 layers, 4096 wide, a last BN without scale and shift.
DEFAULT_PREDICTOR = dict(type='MLPNeck', hidden_dim=4096, num_layers=2, with_last_bn=True,
                         last_bn_affine=False)


def cosine_momentum(base: float, iteration: int, max_iters: int) -> float:
    """MoCo v3's momentum at ``iteration`` of ``max_iters``: from ``base`` up to 1 on a half cosine."""
    done = min(max(iteration / max(max_iters, 1), 0.0), 1.0)
    return 1.0 - (1.0 - base) * (math.cos(math.pi * done) + 1.0) / 2.0


@MODELS.register_module()
class MoCoV3(KeyEncoder, ContrastiveAlgorithm):
    """MoCo v3: base encoder with a prediction head, momentum encoder, symmetric batch InfoNCE.

    Args:
        backbone, neck: the encoder f and its projection head g (MoCo v3's ViT head: 3 layers,
            4096 wide, to 256, a last BN without affine).
        predictor: the prediction head h on the query side (``MLPNeck``; its ``in_dim`` and
            ``out_dim`` default to the projection's width).
        momentum: m₀, the key encoder's share of its own weights at the first iteration (0.99
            for ViT-S/B in the paper), rising to 1 on a cosine.
        temperature: τ (0.2 for ViT); each direction's loss is scaled by 2τ, as in the paper.
    """

    def __init__(self, backbone: dict, neck: dict, predictor: dict | None = None,
                 momentum: float = 0.99, temperature: float = 0.2,
                 cluster_encoder: Literal['momentum', 'query'] = 'momentum', **kwargs) -> None:
        momentum = check_number(
            type(self).__name__, 'momentum', momentum, low=0, high=1, high_open=True,
            hint="the key encoder's share of its own weights at the first iteration (m0); 1 "
            'would keep it at its initial weights')
        super().__init__(backbone, neck, temperature, **kwargs)
        self.base_momentum = momentum
        predictor = dict(predictor or DEFAULT_PREDICTOR)
        predictor.setdefault('in_dim', self.neck.out_dim)
        predictor.setdefault('out_dim', self.neck.out_dim)
        self.predictor = MODELS.build(predictor)
        # Plain copies: the keys of a view are one batch, whose BN statistics are their own, as
        # each process's in the paper (SyncBN across processes is the Runner's choice).
        self._build_key_encoder(cluster_encoder=cluster_encoder)
        self.momentum = self.base_momentum
        self.max_iters: int | None = None  # set by MomentumScheduleHook before each iteration
        self._batch_norm_backbone = any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                        for m in self.backbone.modules())

    def set_progress(self, iteration: int, max_iters: int) -> None:
        """The iterations done and the run's total: sets this iteration's momentum."""
        self.max_iters = max_iters
        self.momentum = cosine_momentum(self.base_momentum, iteration, max_iters)

    def predict_queries(self, features: torch.Tensor) -> torch.Tensor:
        """L2-normalised queries q = h(g(f)) of backbone features f, in float32."""
        return F.normalize(self.predictor(self.neck(features)).float(), dim=1)

    def _per_view(self, fn, features: torch.Tensor) -> torch.Tensor:
        # The heads' BN normalises each view's batch on its own, as the paper's two forwards.
        return torch.cat([fn(part) for part in features.chunk(2)])

    def _backbone_views(self, backbone: nn.Module, views: torch.Tensor) -> torch.Tensor:
        """Backbone features of the two views ``[2M, ...]``: one pass, or one a view where BN would
        mix them."""
        # A ViT (LayerNorm only) gives each image the features of two separate passes in one; a
        # ResNet's BN would normalise over both views at once, where MoCo v3 runs one forward a view.
        if self._batch_norm_backbone:
            return self._per_view(backbone, views)
        return backbone(views)

    @torch.no_grad()
    def keys(self, inputs: torch.Tensor) -> torch.Tensor:
        """Normalised keys of the momentum encoder for the two views ``[2M, ...]``, per view."""
        feats = self._backbone_views(self.momentum_backbone, inputs)
        return self._per_view(lambda f: F.normalize(self.momentum_neck(f).float(), dim=1), feats)

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """The symmetric loss of a batch's two views, with its detector's flags treated."""
        self._check_views(inputs)
        if self.training and self.max_iters is None:
            raise RuntimeError("MoCoV3's momentum follows the iterations: add "
                               "dict(type='MomentumScheduleHook') to default_hooks (it is in "
                               'configs/_base_/default_runtime.py) or call set_progress()')
        views = torch.cat(inputs[:2])
        features = self._backbone_views(self.backbone, views)  # the heads: each view on its own
        self._momentum_update()  # the key encoder only, before the keys, as the paper's step
        keys = self.keys(views)
        support = None
        if self.needs.support_views:  # FNC: embedded as keys, the space they are compared in
            num = inputs[0].shape[0]
            with torch.no_grad():
                support = self._key_embed(torch.cat(inputs[2:])).view(-1, num, keys.shape[1])
            support = support.transpose(0, 1)
        losses = self.compiled('head_losses', features.device)(features, keys, data_samples,
                                                                support)
        return self._add_detection(losses)

    def head_losses(self, features: torch.Tensor, keys: torch.Tensor, data_samples: dict,
                    support: torch.Tensor | None = None) -> dict:
        """The loss of the two views' backbone features ``[2M, F]`` (queries made here) against
        the keys ``[2M, D]`` (:meth:`pair_losses`)."""
        queries = self._per_view(self.predict_queries, features)
        return self.pair_losses(queries, keys, data_samples, support)

    def negative_batch(self, queries: torch.Tensor, keys: torch.Tensor, data_samples: dict,
                       support: torch.Tensor | None = None) -> NegativeBatch:
        """The layout: the 2M local queries ``cat([q1, q2])`` against the keys of all processes
        ``cat([k1s, k2s])``, each query against the other view's keys (its positive: its own
        image's)."""
        k1, k2 = keys.chunk(2)
        candidates = torch.cat([gather_no_grad(k1), gather_no_grad(k2)])  # [2T, D]
        return self.cross_view_batch(queries, candidates, data_samples, support)

    def pair_losses(self, queries: torch.Tensor, keys: torch.Tensor, data_samples: dict,
                    support: torch.Tensor | None = None) -> dict:
        """``ctr(q1, k2) + ctr(q2, k1)`` of the queries ``cat([q1, q2])`` and the local keys
        ``cat([k1, k2])``, each ``2τ`` times the mean cross entropy over its M queries."""
        losses = self.negatives_loss(self.negative_batch(queries, keys, data_samples, support))
        # Two directions of M queries each: their means' sum is twice the mean over the 2M.
        losses['loss'] = 2 * self.temperature * 2 * losses['loss']
        return losses
