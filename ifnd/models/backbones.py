"""Backbones: any timm model that returns pooled features."""
from typing import Annotated, Literal

import timm
import torch
from mmengine.model import BaseModule
from torch import nn

from ifnd.device import check_compile, compile_options
from ifnd.models.vit_architecture import (VIT_DEPTH, VIT_SIZE, check_vit_memory, check_vit_sizes,
                                          vit_defaults)
from ifnd.registry import MODELS


@MODELS.register_module()
class TimmBackbone(BaseModule):
    """A timm model by name, returning its globally pooled features ``[B, out_dim]``.

    ``cifar_stem=True`` swaps a ResNet-family stem for a 3x3 stride-1 convolution without
    max-pooling, the usual choice for 28/32-pixel images.
    ``channels_last=True`` keeps the weights and inputs in NHWC memory format (tensor-core
    friendly convolutions on GPUs; the same results, and harmless, on a CPU).
    ``compile=True`` (or a dict of ``torch.compile`` options, e.g. ``dict(backend='eager')``)
    compiles the network in place at its first forward: the state-dict keys stay the same, and a
    copy made before (MoCo's key encoder) is compiled on its own; shapes are static
    (``dynamic=False``) unless the dict sets ``dynamic``. ``compile='auto'`` (the GPU
    recipes) compiles when CUDA is available and the first forward runs there, and leaves the
    network uncompiled on a CPU, where the compile time is rarely won back.
    """

    def __init__(self, model_name: str, pretrained: bool = False, cifar_stem: bool = False,
                 channels_last: bool = False, compile: bool | Literal['auto'] | dict = False,
                 init_cfg: dict | None = None, **timm_kwargs) -> None:
        super().__init__(init_cfg)
        try:
            self.model = timm.create_model(model_name, pretrained=pretrained, num_classes=0,
                                           **timm_kwargs)
        except RuntimeError as err:
            if 'Unknown model' in str(err):
                raise ValueError(f'timm has no model named {model_name!r}; see '
                                 "timm.list_models('resnet*') for valid names") from err
            raise
        if 'channels' in timm_kwargs:
            self._check_stage_count(model_name, timm_kwargs)
        if cifar_stem:
            self._use_cifar_stem()
        self.out_dim = self.model.num_features
        self.channels_last = channels_last
        if channels_last:
            self.model.to(memory_format=torch.channels_last)
        check_compile(compile, 'model.backbone.compile')
        # The setting itself, which the algorithms' projection head and loss follow.
        self.compile_setting = compile
        # The options where it compiles on this machine (None: never), static shapes by default.
        self.compile_cfg = compile_options(compile, 'cuda' if torch.cuda.is_available() else 'cpu')
        self._compiled = False

    def _check_stage_count(self, model_name: str, timm_kwargs: dict) -> None:
        """Refuse ``channels`` (one width per stage) whose length differs from the network's stages.

        timm's ResNet zips the widths with the stage depths, so a wrong length silently builds a
        network with fewer stages (or ignores the extra widths).
        """
        channels = timm_kwargs['channels']
        others = {k: v for k, v in timm_kwargs.items() if k != 'channels'}
        with torch.device('meta'):  # the default network's layout, without allocating it
            reference = timm.create_model(model_name, pretrained=False, num_classes=0, **others)
        stages = [n for n, _ in reference.named_children() if n.startswith('layer')]
        if stages and len(channels) != len(stages):
            example = ', e.g. channels=(64, 128, 256, 512)' if len(stages) == 4 else ''
            raise ValueError(f'model.backbone.channels={tuple(channels)} gives {len(channels)} '
                             f'widths but {model_name} has {len(stages)} stages; give one width '
                             f'per stage{example}')

    def _use_cifar_stem(self) -> None:
        conv1 = getattr(self.model, 'conv1', None)
        if not isinstance(conv1, nn.Conv2d) or not hasattr(self.model, 'maxpool'):
            raise ValueError('cifar_stem=True needs a ResNet-family timm model with a single '
                             f'conv1 and maxpool; {type(self.model).__name__} has none. Use a '
                             "ResNet ('resnet18', 'resnet50') or set cifar_stem=False")
        self.model.conv1 = nn.Conv2d(conv1.in_channels, conv1.out_channels, 3, 1, 1, bias=False)
        self.model.maxpool = nn.Identity()

    def init_weights(self) -> None:
        """Keep the weights timm made (random or pretrained) unless an ``init_cfg`` asks otherwise."""
        # mmengine's runner calls init_weights() on every module; timm's own init_weights() would
        # re-draw the weights and silently discard pretrained ones.
        if self.init_cfg:
            super().init_weights()

    @property
    def input_size(self) -> int | None:
        """The image size the network requires, None where any size works (convolutions)."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features of a batch of images."""
        if (self.compile_cfg is not None and not self._compiled
                and compile_options(self.compile_setting, x.device) is not None):
            # Module.compile (in place) rather than torch.compile(module): no '_orig_mod.' keys.
            self.model.compile(**self.compile_cfg)
            self._compiled = True
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x)


def sincos_position_embedding(grid: tuple[int, int], dim: int,
                              temperature: float = 10000.0) -> torch.Tensor:
    """MoCo v3's fixed 2-D sin-cos position embedding ``[1, 1 + h·w, dim]``, zero for the class
    token, as its ``build_2d_sincos_position_embedding`` lays it out (token order included)."""
    if dim % 4:
        raise ValueError(f'a 2-D sin-cos position embedding needs a width divisible by 4, got {dim}')
    h, w = grid
    grid_w, grid_h = torch.meshgrid(torch.arange(w, dtype=torch.float32),
                                    torch.arange(h, dtype=torch.float32), indexing='ij')
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    out_w = grid_w.flatten()[:, None] * omega[None]  # [h·w, dim / 4]
    out_h = grid_h.flatten()[:, None] * omega[None]
    patches = torch.cat([out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()], dim=1)
    return torch.cat([torch.zeros(1, dim), patches])[None]


@MODELS.register_module()
class ViTBackbone(TimmBackbone):
    """A timm Vision Transformer (``vit_tiny/small/base_patch16_224``...) returning ``[B, embed_dim]``.

    ``img_size``, ``patch_size``, ``embed_dim``, ``depth``, ``num_heads`` and ``mlp_ratio``
    override the named model's (``img_size=16, patch_size=4`` for 16-32-pixel images); None keeps
    timm's. ``global_pool``: the features are the class token after the final norm (``'token'``,
    MoCo v3's) or the patch tokens' mean followed by a norm (``'avg'``). ``frozen_patch_embed=True``
    keeps the random patch projection as initialised (MoCo v3's stabilisation of ViT training):
    its weights get no gradient, so no optimiser changes them. ``sincos_pos_embed=True`` replaces
    the learned position embedding by MoCo v3's fixed 2-D sin-cos one (not trained either).
    The sizes are checked before anything is built: each in its range, the heads dividing the
    width, and the weights within ``MAX_MODEL_BYTES``.
    """

    def __init__(self, model_name: str = 'vit_small_patch16_224',
                 img_size: Annotated[int, VIT_SIZE] | None = None,
                 patch_size: Annotated[int, VIT_SIZE] | None = None,
                 embed_dim: Annotated[int, VIT_SIZE] | None = None,
                 depth: Annotated[int, VIT_DEPTH] | None = None,
                 num_heads: Annotated[int, VIT_SIZE] | None = None,
                 mlp_ratio: float | None = None, global_pool: Literal['token', 'avg'] = 'token',
                 frozen_patch_embed: bool = False, sincos_pos_embed: bool = False,
                 drop_path_rate: float = 0.0,
                 channels_last: bool = False, compile: bool | Literal['auto'] | dict = False,
                 init_cfg: dict | None = None, pretrained: bool = False) -> None:
        if global_pool not in ('token', 'avg'):
            raise ValueError(f"ViTBackbone global_pool must be 'token' (the class token) or 'avg' "
                             f'(mean of the patch tokens), got {global_pool!r}')
        sizes = dict(img_size=img_size, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
                     num_heads=num_heads, mlp_ratio=mlp_ratio)
        not_vit = ValueError(f'ViTBackbone needs a timm Vision Transformer, {model_name!r} is '
                             "none: use e.g. 'vit_small_patch16_224', or type='TimmBackbone' for "
                             'other networks')
        defaults = vit_defaults(model_name) if isinstance(model_name, str) else None
        if defaults is not None:  # otherwise timm's build below names what the name is
            self._check_sizes(model_name, sizes, defaults, global_pool=global_pool)
        try:
            super().__init__(model_name, pretrained=pretrained, channels_last=channels_last,
                             compile=compile, init_cfg=init_cfg, global_pool=global_pool,
                             drop_path_rate=drop_path_rate,
                             **{key: value for key, value in sizes.items() if value is not None})
        except (AssertionError, TypeError) as err:  # another network's pooling or arguments
            raise not_vit from err
        if not hasattr(self.model, 'patch_embed') or not hasattr(self.model, 'blocks'):
            raise not_vit
        self.global_pool = global_pool
        self.frozen_patch_embed = frozen_patch_embed
        if frozen_patch_embed:
            self.model.patch_embed.requires_grad_(False)
        self.sincos_pos_embed = sincos_pos_embed
        if sincos_pos_embed:
            self._use_sincos_pos_embed()

    @staticmethod
    def _check_sizes(model_name: str, sizes: dict, defaults: dict, **options) -> None:
        """Refuse sizes out of range, heads that do not divide the width, and weights beyond
        ``MAX_MODEL_BYTES``, before a module is made (a block costs time even on the meta device)."""
        import timm
        checked = check_vit_sizes(sizes, defaults)
        given = {key: value for key, value in sizes.items() if value is not None}
        with torch.device('meta'):  # one block: what the others repeat, no memory
            one_block = timm.create_model(model_name, pretrained=False, num_classes=0,
                                          **dict(given, depth=1), **options)
        per_block = sum(p.numel() for p in one_block.blocks[0].parameters())
        total = sum(t.numel() for t in (*one_block.parameters(), *one_block.buffers()))
        element_size = next(one_block.parameters()).element_size()
        check_vit_memory(per_block, total - per_block, checked['depth'], element_size)

    @property
    def input_size(self) -> int | None:
        """The image size of the position embedding, which timm's ViT requires of every input."""
        embed = self.model.patch_embed
        if getattr(self.model, 'dynamic_img_size', False) or not getattr(embed, 'strict_img_size', True):
            return None
        return embed.img_size[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features of a batch of images of the size the position embedding fixes."""
        size = self.input_size
        if size is not None and tuple(x.shape[-2:]) != (size, size):
            raise ValueError(f'model.backbone.img_size={size}, but the data\'s images are '
                             f'{x.shape[-2]}x{x.shape[-1]} pixels (a ViT\'s position embedding '
                             f'fixes its input size): set model.backbone.img_size={x.shape[-2]}, '
                             f'or make the pipeline\'s views {size} pixels')
        return super().forward(x)

    def _use_sincos_pos_embed(self) -> None:
        model = self.model
        if getattr(model, 'num_prefix_tokens', 1) != 1 or model.pos_embed is None:
            raise ValueError('sincos_pos_embed=True needs a ViT with a class token and a position '
                             'embedding of its own (no register tokens)')
        table = sincos_position_embedding(model.patch_embed.grid_size, model.embed_dim)
        if model.pos_embed.shape != table.shape:  # the class token without one (no_embed_class)
            raise ValueError(f'sincos_pos_embed=True: {type(model).__name__} has a position '
                             f'embedding of shape {tuple(model.pos_embed.shape)}, the sin-cos '
                             f'table {tuple(table.shape)}')
        # Data, not a new Parameter: the state-dict key and the meta-device build stay as timm's.
        with torch.no_grad():
            model.pos_embed.copy_(table.to(model.pos_embed.device))
        model.pos_embed.requires_grad_(False)
