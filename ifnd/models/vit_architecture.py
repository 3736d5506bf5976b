"""A Vision Transformer's architecture: the bounds on its sizes, and the ``ViTBackbone`` that
rebuilds one from its weights.

timm-style ViT weights (``cls_token``, ``pos_embed``, ``patch_embed.proj.*``, ``blocks.N.*``,
``norm.*``: DINO's backbone-only files, MoCo v3's base encoder, timm's own) give the width, depth,
patch size, input channels, MLP width and image size (from ``pos_embed``'s token count) by their
shapes, and the pooling by their keys (``fc_norm``: the patch tokens' mean). The number of
attention heads leaves no trace in the shapes (ViT-S/16 has 6 in timm and DINO, 12 in MoCo v3), so
it is never guessed: it comes from the file (its config, MoCo v3's ``arch``), the zoo's index, or the user
(:data:`HEADS_FIX`). What else the shapes leave open, ``ViTBackbone`` cannot set either: timm's
LayerNorm eps 1e-6 (DINO's, MoCo v3's and timm's alike), a bias on qkv (a file without one does not
fit, and is refused).
"""
import functools
import math

import torch

from ifnd.settings import MAX_MODEL_BYTES, MAX_SIZE, Bound, check_number, format_bytes

# timm names whose defaults a ViT's weights may match: (width, patch) -> name.
NAMED_VITS = {(192, 16): 'vit_tiny_patch16_224', (384, 16): 'vit_small_patch16_224',
              (384, 8): 'vit_small_patch8_224', (768, 16): 'vit_base_patch16_224',
              (768, 8): 'vit_base_patch8_224', (1024, 16): 'vit_large_patch16_224'}
FALLBACK_NAME = 'vit_small_patch16_224'
# MoCo v3's vits.py: every ViT it trains (vit_small, vit_base, their conv-stem twins) has 12 heads.
MOCO_V3_VIT_HEADS = {'vit_small': 12, 'vit_base': 12, 'vit_conv_small': 12, 'vit_conv_base': 12}
MOCO_V3_PREFIXES = ('module.base_encoder.', 'base_encoder.')
VIT_KEYS = ('pos_embed', 'patch_embed.proj.weight', 'blocks.0.attn.qkv.weight')
# Transformer blocks: each is a dozen module objects, made even on the meta device (about 6 ms and
# 55 kB each: 2**20 blocks took minutes and 2.8 GB before a size check could refuse them). The
# deepest published ViTs have 48 (ViT-22B) and 56 (ViT-e).
VIT_DEPTH = Bound(1, 256)
# Widths, heads, patch and image sizes: each within the bound every width has; their product is
# bounded by the memory the weights would need (MAX_MODEL_BYTES).
VIT_SIZE = Bound(1, MAX_SIZE)
# How a user states the heads a file does not: in every reader of an encoder.
HEADS_FIX = ('pass --num-heads N (num_heads=N in Python, model.pretrained_num_heads=N in a linear or '
             'semi-supervised config), the heads it was trained with (timm\'s and DINO\'s ViT-S/16 '
             'have 6, ViT-B/16 12; MoCo v3\'s ViT-S/16 12)')


class UnstatedHeads(ValueError):
    """A ViT whose attention heads neither its file nor the user states."""


class ImpossibleWeights(ValueError):
    """ViT weights whose keys claim what no ViT has (no name or flag makes them load)."""


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


@functools.lru_cache(maxsize=None)
def vit_defaults(name: str) -> dict | None:
    """The sizes of a timm ViT by name, built on the meta device (no memory); None for another
    network or a name timm does not know."""
    import timm
    try:
        with torch.device('meta'):
            model = timm.create_model(name, pretrained=False, num_classes=0)
    except Exception:  # noqa: BLE001 (an unknown name or a network that is no ViT: the builder says)
        return None
    if not hasattr(model, 'patch_embed') or not hasattr(model, 'blocks') or not len(model.blocks):
        return None
    return dict(img_size=model.patch_embed.img_size[0], patch_size=model.patch_embed.patch_size[0],
                embed_dim=model.embed_dim, depth=len(model.blocks),
                num_heads=model.blocks[0].attn.num_heads,
                mlp_ratio=model.blocks[0].mlp.fc1.out_features / model.embed_dim,
                in_chans=model.patch_embed.proj.in_channels)


def check_vit_sizes(given: dict, defaults: dict) -> dict:
    """The sizes a ViT is built with (``given`` over the named model's ``defaults``), refused in
    one line naming the key and the fix when out of range or inconsistent."""
    for key, value in given.items():
        if value is None:
            continue
        if key == 'mlp_ratio':
            check_number('ViTBackbone', 'mlp_ratio', value, float, low=0, low_open=True,
                         hint='the MLP is mlp_ratio times the width (timm: 4.0); set '
                         'model.backbone.mlp_ratio')
        else:
            bound = VIT_DEPTH if key == 'depth' else VIT_SIZE
            check_number('ViTBackbone', key, value, int, low=bound.low, high=bound.high,
                         hint=f'set model.backbone.{key} in that range')
    sizes = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    width, heads = sizes['embed_dim'], sizes['num_heads']
    if width % heads:
        divisors = [d for d in range(1, min(width, 64) + 1) if width % d == 0]
        raise ValueError(f'ViTBackbone num_heads={heads} does not divide embed_dim={width} (each '
                         'attention head takes an equal share of the width): set '
                         f'model.backbone.num_heads to a divisor of {width} '
                         f'({", ".join(map(str, divisors))}{"..." if width > 64 else ""}) or '
                         f'embed_dim to a multiple of {heads}')
    if sizes['patch_size'] > sizes['img_size']:
        raise ValueError(f'ViTBackbone patch_size={sizes["patch_size"]} is larger than '
                         f'img_size={sizes["img_size"]}, which leaves no patch: set '
                         'model.backbone.patch_size to at most model.backbone.img_size')
    hidden = int(width * sizes['mlp_ratio'])
    if not 1 <= hidden <= MAX_SIZE:
        raise ValueError(f'ViTBackbone mlp_ratio={sizes["mlp_ratio"]:g} at embed_dim={width} makes '
                         f'an MLP of {hidden:.3g} features, not 1 to {MAX_SIZE}: set '
                         'model.backbone.mlp_ratio (timm: 4.0) or embed_dim')
    return sizes


def check_vit_memory(per_block: int, rest: int, depth: int, element_size: int) -> None:
    """Refuse a ViT whose weights would need more than ``MAX_MODEL_BYTES``: ``per_block`` and
    ``rest`` count the elements of one block and of everything else."""
    needed = (rest + depth * per_block) * element_size
    if needed > MAX_MODEL_BYTES:
        raise ValueError(f'ViTBackbone would need {format_bytes(needed)} for its weights ({depth} '
                         f'blocks of {format_bytes(per_block * element_size)}), more than the '
                         f'{format_bytes(MAX_MODEL_BYTES)} a model may take: lower '
                         'model.backbone.depth, embed_dim, mlp_ratio or the patch grid '
                         '(img_size / patch_size)')


def _block_depth(state: dict) -> int:
    """The blocks of ViT weights, refused before anything is built when their keys do not number
    0 to depth - 1 or there are more than a ViT may have."""
    indices = {k.split('.')[1] for k in state if k.startswith('blocks.')}
    numbers = sorted(int(i) for i in indices if i.isdigit())
    damaged = 'the file was altered or cut short: pass the checkpoint that training wrote'
    if len(numbers) != len(indices):
        raise ImpossibleWeights(f'blocks.{next(i for i in indices if not i.isdigit())}.* is no '
                                f'numbered transformer block; {damaged}')
    if numbers[-1] >= VIT_DEPTH.high:
        raise ImpossibleWeights(f'blocks.{numbers[-1]}.* claims {numbers[-1] + 1} transformer blocks, '
                                f'more than the {VIT_DEPTH.high} a ViT may have; {damaged}')
    if len(numbers) != numbers[-1] + 1:
        missing = sorted(set(range(numbers[-1] + 1)) - set(numbers))
        raise ImpossibleWeights(f'the transformer blocks are numbered up to {numbers[-1]} but '
                                f'{len(missing)} are missing (blocks.{missing[0]}.*...); {damaged}')
    return len(numbers)


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
    depth = _block_depth(state)
    fc1 = state.get('blocks.0.mlp.fc1.weight')
    if fc1 is None or fc1.dim() != 2:
        raise ValueError('blocks.0.mlp.fc1.weight is missing: the MLP width cannot be read')
    return dict(img_size=grid * patch, patch_size=patch, embed_dim=embed_dim, depth=depth,
                mlp_ratio=fc1.shape[0] / embed_dim, in_chans=in_chans)


def infer_vit_config(state: dict[str, torch.Tensor], num_heads: int | None = None) -> dict:
    """The ``ViTBackbone`` config of timm-style ViT weights with ``num_heads`` attention heads,
    which the shapes cannot show (:class:`UnstatedHeads` without them).

    The model name is timm's for the width and patch size, with only the settings that differ
    from its defaults, and the heads always; the pooling is the class token's (``global_pool='token'``), or the patch
    tokens' mean when the weights carry timm's ``fc_norm`` (``'avg'``).
    """
    if 'cls_token' not in state:
        raise ValueError('the ViT weights have no cls_token: ViTBackbone needs a class token')
    shapes = vit_shapes(state)
    if num_heads is None:
        raise UnstatedHeads(f'a Vision Transformer {shapes["embed_dim"]} wide, whose attention '
                            'heads its weights cannot show and its file does not state')
    name = NAMED_VITS.get((shapes['embed_dim'], shapes['patch_size']), FALLBACK_NAME)
    defaults = vit_defaults(name)
    shapes['num_heads'] = num_heads
    check_vit_sizes({k: v for k, v in shapes.items() if k != 'in_chans'}, defaults)
    cfg = dict(type='ViTBackbone', model_name=name)
    for key in ('img_size', 'patch_size', 'embed_dim', 'depth', 'mlp_ratio'):
        if shapes[key] != defaults[key]:
            cfg[key] = shapes[key]
    cfg['num_heads'] = num_heads  # stated, never the name's: written down with the architecture
    if shapes['in_chans'] != defaults['in_chans']:
        raise ValueError(f'the ViT takes {shapes["in_chans"]}-channel images; ViTBackbone builds '
                         '3-channel ones')
    if 'fc_norm.weight' in state:
        cfg['global_pool'] = 'avg'
    return cfg
