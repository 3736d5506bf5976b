"""The layouts a checkpoint may hold a backbone in, and the backbone's weights read from any of them.

ifnd's own training checkpoints, MoCo v1/v2/v3, PCL, HCSC, solo-learn, mmselfsup/mmpretrain,
VISSL, bare torchvision/timm state dicts (DINO's backbone-only files) and transformers' ViTs (the
Hugging Face Hub's copies of DINO): the backbone's keys come out under timm/torchvision names,
head keys dropped.
"""
import torch

from .hf_vit import hf_vit_prefix, hf_vit_to_timm

# (where, key prefix of the backbone inside the state dict), tried in this order; the first prefix
# that some key starts with is the backbone.
CHECKPOINT_LAYOUTS = (
    ('ifnd training checkpoint', 'backbone.model.'),
    ('MoCo v1/v2, PCL', 'module.encoder_q.'),
    ('MoCo v1/v2, PCL (not DataParallel)', 'encoder_q.'),
    ('MoCo v3', 'module.base_encoder.'),
    ('MoCo v3 (not DataParallel)', 'base_encoder.'),
    ('ifnd training checkpoint (DataParallel)', 'module.backbone.model.'),
    ('solo-learn, mmselfsup/mmpretrain', 'backbone.'),
    ('VISSL trunk', '_feature_blocks.'),
    ('DataParallel state dict', 'module.'),
    ('model wrapper', 'model.'),
)
BACKBONE_PREFIXES = tuple(prefix for _, prefix in CHECKPOINT_LAYOUTS)
# Keys that belong to a classifier or projection head, never to the backbone.
HEAD_PREFIXES = ('fc.', 'head.', 'classifier.')
# First key components of a bare (un-prefixed) backbone: torchvision/timm ResNets and timm's others.
BARE_BACKBONE_KEYS = ('conv1.', 'bn1.', 'layer1.', 'stem.', 'patch_embed.', 'blocks.', 'stages.',
                      'features.', 'cls_token', 'pos_embed')


def _tensors(mapping) -> dict[str, torch.Tensor]:
    return {k: v for k, v in mapping.items() if isinstance(v, torch.Tensor)}


def _inner_state(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The state dict inside a checkpoint's wrappers (VISSL's nesting included)."""
    classy = checkpoint.get('classy_state_dict')
    if isinstance(classy, dict):  # VISSL: classy_state_dict.base_model.model.trunk
        trunk = ((classy.get('base_model') or {}).get('model') or {}).get('trunk')
        if isinstance(trunk, dict):
            return _tensors(trunk)
    for key in ('state_dict', 'model_state_dict', 'model'):
        if isinstance(checkpoint.get(key), dict) and _tensors(checkpoint[key]):
            return _tensors(checkpoint[key])
    return _tensors(checkpoint)


def key_prefixes(keys, depth: int = 2, limit: int = 12) -> str:
    """The keys' first ``depth`` components with their counts, for messages."""
    counts: dict[str, int] = {}
    for key in keys:
        prefix = '.'.join(key.split('.')[:depth]) + ('.' if key.count('.') >= depth else '')
        counts[prefix] = counts.get(prefix, 0) + 1
    shown = [f'{p} ({n})' for p, n in list(counts.items())[:limit]]
    return ', '.join(shown) + (f' ... ({len(counts)} in all)' if len(counts) > limit else '')


def backbone_state(checkpoint: dict, source: str = 'checkpoint') -> dict[str, torch.Tensor]:
    """The backbone's weights under timm/torchvision key names, from any supported layout."""
    state = _inner_state(checkpoint)
    hf_prefix = hf_vit_prefix(state)
    if hf_prefix is not None:  # transformers' ViT: renamed, nothing else in the file is a backbone
        return hf_vit_to_timm(state, hf_prefix)
    for prefix in BACKBONE_PREFIXES:
        if any(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            break
    else:
        if not any(k.startswith(BARE_BACKBONE_KEYS) for k in state):
            layouts = '; '.join(f'{name}: {prefix}*' for name, prefix in CHECKPOINT_LAYOUTS)
            raise ValueError(
                f'{source}: unknown checkpoint layout. Top-level keys: '
                f'[{", ".join(map(str, list(checkpoint)[:12]))}]; tensor key prefixes: '
                f'[{key_prefixes(state) or "none"}]. Layouts read: {layouts}; or a bare '
                'torchvision/timm state dict, or a transformers ViT. Re-save the backbone under one of '
                'these prefixes')
    return {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
