"""NNCLR (Dwibedi et al., ICCV 2021): a view's positive is its nearest neighbour in a support set.

The encoder f and projection g give z = g(f(x)), the prediction head h gives p = h(z), both
L2-normalised. The support set Q is a queue of past projections (each step's first views, the
authors' choice) and NN(z, Q) the queued projection of the highest cosine similarity to z. The loss
is symmetric over the two views, over the predictions of the batch gathered across processes:

    L = ½ [ CE(NN(z1, Q) · p2ᵀ / τ, own image) + CE(NN(z2, Q) · p1ᵀ / τ, own image) ]

No gradient reaches a neighbour (a queued value); it flows through the predictions.

The layout for the false-negative parts is MoCo v3's (``mocov3.py``): anchors are the 2M neighbours
``cat([NN(z1), NN(z2)])``, each standing for the image whose view it replaces (its sample index and
class); candidates the predictions of all processes ``cat([p1s, p2s])``; an anchor's candidates are
the other view's predictions (its positive: its own image's), those of its own view are none. So
every detector, treatment and weighting works on it, and its flags are counted like SimCLR's.
"""
import torch
import torch.nn.functional as F

from ifnd.dist import gather_no_grad, gather_with_grad
from ifnd.models.contrastive import ContrastiveAlgorithm
from ifnd.models.false_negatives import NegativeBatch
from ifnd.models.moco import ring_enqueue
from ifnd.registry import MODELS
from ifnd.settings import check_number

# The authors' prediction MLP: 4096 wide, to the projection's width, no BN after its last layer.
DEFAULT_PREDICTOR = dict(type='MLPNeck', hidden_dim=4096, num_layers=2, with_last_bn=False)


@MODELS.register_module()
class NNCLR(ContrastiveAlgorithm):
    """NNCLR: support-set nearest neighbours contrasted with the other view's predictions.

    Args:
        backbone, neck: the encoder f and its projection head g (the authors': 3 layers, 2048
            wide, to 256, BN after each).
        predictor: the prediction head h (``MLPNeck``; ``in_dim`` and ``out_dim`` default to the
            projection's width).
        support_size: the support set's length |Q| (the authors': 98,304).
        temperature: τ (the authors': 0.1).
    """

    def __init__(self, backbone: dict, neck: dict, predictor: dict | None = None,
                 support_size: int = 98304, temperature: float = 0.1, **kwargs) -> None:
        support_size = check_number(type(self).__name__, 'support_size', support_size, int, low=1,
                                    hint='the queued projections the neighbours are drawn from')
        super().__init__(backbone, neck, temperature, **kwargs)
        predictor = dict(predictor or DEFAULT_PREDICTOR)
        predictor.setdefault('in_dim', self.neck.out_dim)
        predictor.setdefault('out_dim', self.neck.out_dim)
        self.predictor = MODELS.build(predictor)
        # Random unit rows until real projections replace them, as MoCo's queue starts.
        self.register_buffer('support', F.normalize(torch.randn(support_size, self.neck.out_dim), dim=1))
        self.register_buffer('support_ptr', torch.zeros((), dtype=torch.long))

    def heads(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised projections z and predictions p ``[2M, D]`` of the two views' features."""
        z = self.neck(features)
        return F.normalize(z.float(), dim=1), F.normalize(self.predictor(z).float(), dim=1)

    @torch.no_grad()
    def neighbours(self, z: torch.Tensor) -> torch.Tensor:
        """NN(z, Q) ``[N, D]``: the support set's row most similar to each projection (a copy)."""
        return self.support[(z @ self.support.t()).argmax(dim=1)]

    @torch.no_grad()
    def support_predictions(self, inputs: list[torch.Tensor], num: int) -> torch.Tensor | None:
        """Predictions of the support views ``[M, S, D]`` (FNC): compared with the candidates, which
        are predictions; no gradient."""
        support = self.needs.support_views
        if not support:
            return None
        _, p = self.heads(self.backbone(torch.cat(inputs[2:])))
        return p.view(support, num, -1).transpose(0, 1)

    def negative_batch(self, neighbours: torch.Tensor, predictions: torch.Tensor, data_samples: dict,
                       support: torch.Tensor | None = None) -> NegativeBatch:
        """The layout: the 2M neighbours ``cat([NN(z1), NN(z2)])`` against the predictions of all
        processes ``cat([p1s, p2s])`` (with gradients), each against the other view's."""
        p1, p2 = predictions.chunk(2)
        candidates = torch.cat([gather_with_grad(p1), gather_with_grad(p2)])  # [2T, D]
        return self.cross_view_batch(neighbours, candidates, data_samples, support)

    def head_losses(self, neighbours: torch.Tensor, predictions: torch.Tensor, data_samples: dict,
                    support: torch.Tensor | None = None) -> dict:
        """The loss of the neighbours ``[2M, D]`` against the predictions ``[2M, D]``."""
        return self.negatives_loss(self.negative_batch(neighbours, predictions, data_samples, support))

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """The symmetric loss of a batch's two views, with its detector's flags treated; the first
        views' projections then join the support set."""
        self._check_views(inputs)
        features = self.backbone(torch.cat(inputs[:2]))  # one batch of 2M: BN sees both views
        z, p = self.compiled('heads', features.device)(features)
        # Looked up outside the compiled loss: the support set changes in place after the step.
        neighbours = self.neighbours(z.detach())
        support = self.support_predictions(inputs, z.shape[0] // 2)
        losses = self.compiled('head_losses', features.device)(neighbours, p, data_samples, support)
        ring_enqueue(self.support_ptr, (self.support, ), (gather_no_grad(z.detach().chunk(2)[0]), ))
        return self._add_detection(losses)
