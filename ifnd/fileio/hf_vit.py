"""Hugging Face ``transformers`` ViT weights (``ViTModel``, e.g. the Hub's ``facebook/dino-vits16``)
under timm's names: the inverse of transformers' ``convert_dino_to_pytorch.py`` renaming, with
the separate query, key and value projections joined into timm's ``qkv``."""
import re

import torch

# A ViTModel's own keys, or a ViTForImageClassification's under ``vit.``.
HF_VIT_MARK = 'embeddings.patch_embeddings.projection.weight'
HF_PREFIXES = ('', 'vit.')
# transformers name -> timm name, for everything but the query/key/value split.
HF_TO_TIMM = (
    (r'embeddings\.cls_token', 'cls_token'),
    (r'embeddings\.position_embeddings', 'pos_embed'),
    (r'embeddings\.patch_embeddings\.projection\.(weight|bias)', r'patch_embed.proj.\1'),
    (r'encoder\.layer\.(\d+)\.layernorm_before\.', r'blocks.\1.norm1.'),
    (r'encoder\.layer\.(\d+)\.attention\.output\.dense\.', r'blocks.\1.attn.proj.'),
    (r'encoder\.layer\.(\d+)\.layernorm_after\.', r'blocks.\1.norm2.'),
    (r'encoder\.layer\.(\d+)\.intermediate\.dense\.', r'blocks.\1.mlp.fc1.'),
    (r'encoder\.layer\.(\d+)\.output\.dense\.', r'blocks.\1.mlp.fc2.'),
    (r'layernorm\.', 'norm.'),
)
QKV = re.compile(r'encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)')


def hf_vit_prefix(state: dict) -> str | None:
    """The key prefix of a transformers ViT inside a state dict, or None when it holds none."""
    for prefix in HF_PREFIXES:
        if prefix + HF_VIT_MARK in state:
            return prefix
    return None


def hf_vit_to_timm(state: dict[str, torch.Tensor], prefix: str = '') -> dict[str, torch.Tensor]:
    """A transformers ViT's weights under timm's names; its pooler and classifier are left out."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        qkv = QKV.fullmatch(name)
        if qkv:
            parts.setdefault((qkv[1], qkv[3]), {})[qkv[2]] = value
            continue
        for pattern, replacement in HF_TO_TIMM:
            renamed, found = re.subn(rf'^{pattern}', replacement, name)
            if found:
                out[renamed] = value
                break
    for (block, kind), qkv_parts in parts.items():
        missing = {'query', 'key', 'value'} - set(qkv_parts)
        if missing:
            raise ValueError(f'encoder.layer.{block}.attention.attention has no '
                             f'{", ".join(sorted(missing))} {kind}')
        out[f'blocks.{block}.attn.qkv.{kind}'] = torch.cat(
            [qkv_parts['query'], qkv_parts['key'], qkv_parts['value']])
    return out
