"""Layer-wise learning-rate decay for fine-tuning Vision Transformers (BEiT, MAE, MoCo v3).

The blocks near the input hold the most general features, so fine-tuning moves them least: in a
ViT of L blocks, block i (1..L) learns at lr × r^(L+1−i), the patch embedding, the class, register
and mask tokens and the position embedding at lr × r^(L+1), the final norm and everything outside
the ViT (the classifier, projection heads) at lr.
"""
import logging
from typing import Any

from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn

from ifnd.registry import OPTIM_WRAPPER_CONSTRUCTORS

# The attributes of a timm VisionTransformer that act before its blocks: layer 0 of the decay.
EMBEDDING_NAMES = ('patch_embed', 'cls_token', 'reg_token', 'mask_token', 'pos_embed', 'norm_pre')
NAME = 'LayerDecayOptimWrapperConstructor'


def check_layer_decay_rate(rate: Any) -> float:
    """``paramwise_cfg.layer_decay_rate`` as given, refused unless a number in (0, 1]."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        raise ValueError(f'{NAME} needs optim_wrapper.paramwise_cfg.layer_decay_rate in (0, 1], '
                         f'the lr ratio of a ViT block to the block above it (0.75 or 0.65 are '
                         f'usual; 1 turns the decay off), got {rate!r}')
    return float(rate)


def vit_modules(model: nn.Module) -> dict[str, int]:
    """The Vision Transformers in ``model`` (timm's layout: ``patch_embed`` and ``blocks``), by
    their module names, with their depths."""
    found = {}
    for name, module in model.named_modules():
        blocks = getattr(module, 'blocks', None)
        if hasattr(module, 'patch_embed') and isinstance(blocks, (nn.ModuleList, nn.Sequential)) \
                and len(blocks):
            found[name] = len(blocks)
    return found


def layer_id(name: str, depth: int) -> int:
    """The decay layer of a ViT's parameter by its name inside the ViT: 0 for the embeddings,
    i + 1 for ``blocks.i``, ``depth + 1`` for what follows the blocks."""
    first, _, rest = name.partition('.')
    if first == 'blocks':
        return int(rest.partition('.')[0]) + 1
    return 0 if first in EMBEDDING_NAMES else depth + 1


def layer_lr_scales(model: nn.Module, rate: float) -> dict[str, float]:
    """Each ViT parameter's lr factor by its name in ``model`` (the others are absent: factor 1)."""
    vits = vit_modules(model)
    if not vits:
        raise ValueError(f'{NAME} decays the learning rate through the blocks of a Vision '
                         f'Transformer, and {type(model).__name__} has none (no module with '
                         "patch_embed and blocks): use a ViTBackbone, or remove "
                         f"constructor='{NAME}' and layer_decay_rate from optim_wrapper")
    scales = {}
    # The innermost ViT wins where ViTs nest (none of timm's do).
    for prefix, depth in sorted(vits.items(), key=lambda item: len(item[0])):
        vit = model.get_submodule(prefix) if prefix else model
        for name, _ in vit.named_parameters():
            full = f'{prefix}.{name}' if prefix else name
            scales[full] = rate ** (depth + 1 - layer_id(name, depth))
    return scales


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor with layer-wise lr decay on every ViT of the model.

    ``paramwise_cfg.layer_decay_rate`` (r, in (0, 1]) is required; the layers are as the module
    docstring says, each ViT (e.g. ``backbone.model``) scaled by its own depth. The other
    ``paramwise_cfg`` rules are mmengine's and compose: weight-decay multipliers (norms, biases,
    ``custom_keys``) stay as they are, and lr multipliers (``custom_keys`` ``lr_mult``,
    ``bias_lr_mult``) multiply the layer's factor. Configured as::

        optim_wrapper = dict(constructor='LayerDecayOptimWrapperConstructor',
                             paramwise_cfg=dict(layer_decay_rate=0.75, norm_decay_mult=0.0))
    """

    # The paramwise_cfg keys it reads besides mmengine's (the config checks refuse them elsewhere).
    paramwise_keys = ('layer_decay_rate',)

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict | None = None) -> None:
        # The rate stays in paramwise_cfg: an empty one would skip add_params altogether.
        self.layer_decay_rate = check_layer_decay_rate((paramwise_cfg or {}).get('layer_decay_rate'))
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        if self.base_lr is None:
            raise ValueError(f'{NAME} scales optim_wrapper.optimizer.lr, which is not set: give '
                             'the optimizer its lr')

    def add_params(self, params: list[dict], module: nn.Module, prefix: str = '',
                   **kwargs) -> None:
        """mmengine's parameter groups, each lr then scaled by its ViT layer (at the top call)."""
        if prefix:  # a sub-module, reached from the top call's recursion
            super().add_params(params, module, prefix, **kwargs)
            return
        scales = layer_lr_scales(module, self.layer_decay_rate)
        names = {id(param): name for name, param in module.named_parameters()}
        first = len(params)
        super().add_params(params, module, prefix, **kwargs)
        for group in params[first:]:
            (param,) = group['params']  # mmengine makes one group per parameter
            group['lr'] = group.get('lr', self.base_lr) * scales.get(names[id(param)], 1.0)
        self._log_layers(module)

    def _log_layers(self, model: nn.Module) -> None:
        rate = self.layer_decay_rate
        for prefix, depth in vit_modules(model).items():
            vit = model.get_submodule(prefix) if prefix else model
            if not any(param.requires_grad for param in vit.parameters()):
                continue  # not trained (MoCo's momentum encoder): nothing to say
            print_log(f'layer-wise lr decay {rate:g} on {prefix or type(model).__name__} '
                      f'({depth} blocks): embeddings lr x {rate ** (depth + 1):.3g}, blocks.0 '
                      f'x {rate ** depth:.3g} ... blocks.{depth - 1} x {rate:.3g}, the rest x 1',
                      logger='current', level=logging.INFO)

