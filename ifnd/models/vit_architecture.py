"""A Vision Transformer's architecture read from its weights: the ``ViTBackbone`` that rebuilds it.

timm-style ViT weights (``cls_token``, ``pos_embed``, ``patch_embed.proj.*``, ``blocks.N.*``,
``norm.*``: DINO's backbone-only files, MoCo v3's base encoder, timm's own) give the width, depth,
patch size, input channels, MLP ratio and image size (from ``pos_embed``'s token count) by their
shapes. The number of attention heads leaves no trace in the shapes: it is MoCo v3's (12 for its
``vit_small`` and ``vit_base``) when a MoCo v3 checkpoint names its ``arch``, otherwise timm's and
DINO's convention of 64-wide heads (ViT-S 6, ViT-B 12; one head below a width of 64).
"""
import math

import torch

# timm names whose defaults a ViT's weights may match: (width, patch) -> name.
NAMED_VITS = {(192, 16): 'vit_tiny_patch16_224', (384, 16): 'vit_small_patch16_224',
              (384, 8): 'vit_small_patch8_224', (768, 16): 'vit_base_patch16_224',
              (768, 8): 'vit_base_patch8_224', (1024, 16): 'vit_large_patch16_224'}
FALLBACK_NAME = 'vit_small_patch16_224'
# The width of one attention head in timm's and DINO's ViTs (vit_small 384 / 6, vit_base 768 / 12).
HEAD_DIM = 64
# MoCo v3's vits.py: every ViT it trains (vit_small, vit_base, their conv-stem twins) has 12 heads.
MOCO_V3_VIT_HEADS = {'vit_small': 12, 'vit_base': 12, 'vit_conv_small': 12, 'vit_conv_base': 12}
MOCO_V3_PREFIXES = ('module.base_encoder.', 'base_encoder.')
VIT_KEYS = ('pos_embed', 'patch_embed.proj.weight', 'blocks.0.attn.qkv.weight')


def is_vit_state(state: dict) -> bool:
    """Whether a backbone state dict holds a timm-style Vision Transformer."""
    return all(key in state for key in VIT_KEYS)


def checkpoint_num_heads(checkpoint: dict) -> int | None:
    """The attention heads a checkpoint's own entries state (MoCo v3's ``arch``), else None."""
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get('arch'), str):
        return None
    state = checkpoint.get('state_dict')
    moco_v3 = isinstance(state, dict) and any(str(k).startswith(MOCO_V3_PREFIXES) for k in state)
    return MOCO_V3_VIT_HEADS.get(checkpoint['arch']) if moco_v3 else None


def default_num_heads(embed_dim: int) -> int:
    """Attention heads of timm's and DINO's ViTs of a width: 64-wide heads, at least one."""
    return max(1, embed_dim // HEAD_DIM)


def _named_defaults(name: str) -> dict:
    """The architecture of a timm ViT by name, built on the meta device (no memory)."""
    import timm
    with torch.device('meta'):
        model = timm.create_model(name, pretrained=False, num_classes=0)
    return dict(img_size=model.patch_embed.img_size[0], patch_size=model.patch_embed.patch_size[0],
                embed_dim=model.embed_dim, depth=len(model.blocks),
                num_heads=model.blocks[0].attn.num_heads,
                mlp_ratio=model.blocks[0].mlp.fc1.out_features / model.embed_dim,
                in_chans=model.patch_embed.proj.in_channels)


def vit_shapes(state: dict[str, torch.Tensor]) -> dict:
    """Width, depth, patch size, channels, MLP ratio and image size of ViT weights, by their shapes."""
    proj = state['patch_embed.proj.weight']
    if proj.dim() != 4 or proj.shape[-1] != proj.shape[-2]:
        raise ValueError(f'patch_embed.proj.weight has shape {tuple(proj.shape)}, not a square '
                         'patch projection [width, channels, patch, patch]')
    embed_dim, in_chans, patch = proj.shape[0], proj.shape[1], proj.shape[-1]
    prefix_tokens = 1 if 'cls_token' in state else 0
    patches = state['pos_embed'].shape[1] - prefix_tokens
    grid = math.isqrt(max(patches, 0))
    if grid * grid != patches or grid == 0:
        raise ValueError(f'pos_embed has {state["pos_embed"].shape[1]} tokens: not a class token '
                         'and a square grid of patches')
    depth = 1 + max(int(k.split('.')[1]) for k in state if k.startswith('blocks.'))
    fc1 = state.get('blocks.0.mlp.fc1.weight')
    mlp_ratio = fc1.shape[0] / embed_dim if fc1 is not None else 4.0
    return dict(img_size=grid * patch, patch_size=patch, embed_dim=embed_dim, depth=depth,
                mlp_ratio=mlp_ratio, in_chans=in_chans)


def infer_vit_config(state: dict[str, torch.Tensor], num_heads: int | None = None) -> dict:
    """The ``ViTBackbone`` config of timm-style ViT weights; ``num_heads`` when the file states it.

    The model name is timm's for the width and patch size, with only the settings that differ
    from its defaults; the pooling is the class token's (``global_pool='token'``), or the patch
    tokens' mean when the weights carry timm's ``fc_norm`` (``'avg'``).
    """
    if 'cls_token' not in state:
        raise ValueError('the ViT weights have no cls_token: ViTBackbone needs a class token')
    shapes = vit_shapes(state)
    shapes['num_heads'] = num_heads or default_num_heads(shapes['embed_dim'])
    if shapes['embed_dim'] % shapes['num_heads']:
        raise ValueError(f'a ViT of width {shapes["embed_dim"]} cannot have {shapes["num_heads"]} '
                         'attention heads')
    name = NAMED_VITS.get((shapes['embed_dim'], shapes['patch_size']), FALLBACK_NAME)
    defaults = _named_defaults(name)
    cfg = dict(type='ViTBackbone', model_name=name)
    for key in ('img_size', 'patch_size', 'embed_dim', 'depth', 'num_heads', 'mlp_ratio'):
        if shapes[key] != defaults[key]:
            cfg[key] = shapes[key]
    if shapes['in_chans'] != defaults['in_chans']:
        raise ValueError(f'the ViT takes {shapes["in_chans"]}-channel images; ViTBackbone builds '
                         '3-channel ones')
    if 'fc_norm.weight' in state:
        cfg['global_pool'] = 'avg'
    return cfg
