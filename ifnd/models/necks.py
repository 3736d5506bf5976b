"""Projection heads g(.) mapping backbone features to the contrastive embedding."""
import torch
from mmengine.model import BaseModule
from torch import nn

from ifnd.registry import MODELS


@MODELS.register_module()
class MLPNeck(BaseModule):
    """An MLP projection head: ``num_layers`` linear layers, BN + ReLU between them.

    ``with_last_bn``: a BN after the last layer too; ``last_bn_affine=False`` leaves that BN without
    scale and shift (SimCLR's and MoCo v3's heads: the embedding is normalised anyway).
    """

    def __init__(self, in_dim: int, hidden_dim: int = 2048, out_dim: int = 128, num_layers: int = 2,
                 with_bn: bool = True, with_last_bn: bool = False, last_bn_affine: bool = True,
                 init_cfg: dict | None = None) -> None:
        super().__init__(init_cfg)
        if num_layers < 1:
            raise ValueError(f'MLPNeck needs num_layers >= 1, got {num_layers}')
        layers: list[nn.Module] = []
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == num_layers - 1
            # A BN directly after a linear layer makes its bias redundant.
            use_bn = with_last_bn if last else with_bn
            layers.append(nn.Linear(d_in, d_out, bias=not use_bn))
            if use_bn:
                layers.append(nn.BatchNorm1d(d_out, affine=last_bn_affine or not last))
            if not last:
                layers.append(nn.ReLU(inplace=True))
        self.mlp = nn.Sequential(*layers)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Projected (not yet normalised) embeddings."""
        return self.mlp(x)
