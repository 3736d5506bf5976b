"""A ResNet backbone in detectron2's weight format: renaming timm/torchvision weights to its
backbone names and back, and writing a checkpoint's backbone as the pickle its checkpointer reads
(C4: ``res5.*`` lands in the RoI head)."""
from __future__ import annotations

import io
import pickle
import re

import numpy as np
import torch

from ifnd.fileio import AtomicLocalBackend
from ifnd.fileio.checkpoint_layouts import HEAD_PREFIXES
from ifnd.models.encoder import load_encoder

# detectron2 builds exactly these ResNets: (blocks per stage, bottleneck blocks) -> depth.
RESNET_DEPTHS = {((2, 2, 2, 2), False): 18, ((3, 4, 6, 3), False): 34, ((3, 4, 6, 3), True): 50,
                 ((3, 4, 23, 3), True): 101, ((3, 8, 36, 3), True): 152}

_BN = r'(weight|bias|running_mean|running_var)'
# (timm/torchvision name, detectron2 name); stage N of timm (layerN) is detectron2's res{N+1}.
_TO_DETECTRON2 = (
    (r'conv1\.weight', lambda m: 'stem.conv1.weight'),
    (rf'bn1\.{_BN}', lambda m: f'stem.conv1.norm.{m[1]}'),
    (r'layer([1-4])\.(\d+)\.conv([1-3])\.weight',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.weight'),
    (rf'layer([1-4])\.(\d+)\.bn([1-3])\.{_BN}',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.norm.{m[4]}'),
    (r'layer([1-4])\.(\d+)\.downsample\.0\.weight',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.shortcut.weight'),
    (rf'layer([1-4])\.(\d+)\.downsample\.1\.{_BN}',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.shortcut.norm.{m[3]}'),
)
_FROM_DETECTRON2 = (
    (r'stem\.conv1\.weight', lambda m: 'conv1.weight'),
    (rf'stem\.conv1\.norm\.{_BN}', lambda m: f'bn1.{m[1]}'),
    (r'res([2-5])\.(\d+)\.conv([1-3])\.weight',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.conv{m[3]}.weight'),
    (rf'res([2-5])\.(\d+)\.conv([1-3])\.norm\.{_BN}',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.bn{m[3]}.{m[4]}'),
    (r'res([2-5])\.(\d+)\.shortcut\.weight',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.downsample.0.weight'),
    (rf'res([2-5])\.(\d+)\.shortcut\.norm\.{_BN}',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.downsample.1.{m[3]}'),
)


def _rename(key: str, rules) -> str | None:
    for pattern, name in rules:
        match = re.fullmatch(pattern, key)
        if match:
            return name(match)
    return None


def _listing(keys: list[str]) -> str:
    return ', '.join(keys[:8]) + (f' ... ({len(keys)} in all)' if len(keys) > 8 else '')


def to_detectron2(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A timm/torchvision ResNet state dict under detectron2's backbone names, as numpy arrays."""
    model, unknown = {}, []
    for key, value in state.items():
        if key.endswith('num_batches_tracked') or key.startswith(HEAD_PREFIXES):
            continue  # detectron2 keeps no batch counter; a classifier head has no place there
        name = _rename(key, _TO_DETECTRON2)
        if name is None:
            unknown.append(key)
            continue
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()  # numpy has no bfloat16; float32 holds it exactly
        model[name] = value.numpy().copy()
    if unknown:
        raise ValueError(
            f'{len(unknown)} weights have no counterpart in detectron2\'s ResNet: '
            f'[{_listing(unknown)}]. detectron2 builds the standard ResNet (one 7x7 stem '
            'convolution, basic or bottleneck blocks); other models (deep stems, SE blocks, '
            'non-ResNets) cannot be exported. Use --engine torchvision for them')
    if not model:
        raise ValueError('no ResNet weights found (expected conv1.weight, layer1.0.conv1.weight, '
                         '...)')
    stem = model.get('stem.conv1.weight')
    if stem is None or stem.shape[1:] != (3, 7, 7):
        shape = 'missing' if stem is None else f'of shape {tuple(stem.shape)}'
        raise ValueError(
            f'the stem convolution conv1.weight is {shape}, but detectron2\'s ResNet stem is a 7x7 '
            'convolution on RGB followed by max-pooling. A CIFAR-stem encoder (3x3, no max-pool, '
            'for 28/32-pixel images) has no detectron2 counterpart; transfer an encoder '
            'pre-trained with the ImageNet stem (cifar_stem=False)')
    return model


def from_detectron2(model: dict) -> dict[str, torch.Tensor]:
    """detectron2 backbone weights (numpy arrays or tensors) under timm/torchvision names."""
    state, unknown = {}, []
    for key, value in model.items():
        name = _rename(key, _FROM_DETECTRON2)
        if name is None:
            unknown.append(key)
            continue
        state[name] = torch.as_tensor(value).clone()
    if unknown:
        raise ValueError(
            f'{len(unknown)} weights are not detectron2 ResNet backbone weights: '
            f'[{_listing(unknown)}]; expected stem.conv1.*, res2.0.conv1.* ... res5.*.shortcut.*')
    return state


def resnet_depth(state: dict[str, torch.Tensor]) -> int:
    """The depth (18, 34, 50, 101 or 152) of a standard ResNet state dict with timm names."""
    blocks = []
    for stage in range(1, 5):
        indices = {int(m[1]) for k in state if (m := re.match(rf'layer{stage}\.(\d+)\.', k))}
        if not indices or indices != set(range(len(indices))):
            raise ValueError(f'not a ResNet: the blocks of layer{stage} are {sorted(indices)}')
        blocks.append(len(indices))
    bottleneck = 'layer1.0.conv3.weight' in state
    depth = RESNET_DEPTHS.get((tuple(blocks), bottleneck))
    if depth is None:
        kind = 'bottleneck' if bottleneck else 'basic'
        raise ValueError(f'a ResNet with {tuple(blocks)} {kind} blocks per stage is none of the '
                         'depths detectron2 builds (18, 34, 50, 101, 152)')
    # detectron2 derives every width from the depth (64 channels in res2, one group): a wide or
    # grouped ResNet (wide_resnet*, resnext*) would not fit its layers.
    conv1, conv2 = state['layer1.0.conv1.weight'], state['layer1.0.conv2.weight']
    if conv1.shape[0] != 64 or conv2.shape[1] != conv2.shape[0]:
        groups = conv2.shape[0] // conv2.shape[1]
        raise ValueError(f'res2 is {conv1.shape[0]} channels wide with {groups} groups; detectron2 '
                         'is set up here for the standard ResNet (64 channels, 1 group)')
    return depth


class _PortablePickler(pickle.Pickler):
    """Arrays as ``numpy.ndarray(shape, dtype, buffer)``: the file loads under numpy 1.x and 2.x.

    numpy 2 pickles arrays through ``numpy._core``, which numpy 1.x (still common beside
    detectron2) cannot import.
    """

    def reducer_override(self, obj):
        if type(obj) is np.ndarray:
            data = bytearray(np.ascontiguousarray(obj).tobytes())  # bytearray: writable on load
            return np.ndarray, (obj.shape, obj.dtype.str, data)
        return NotImplemented


def export_detectron2_weights(checkpoint_path: str, out: str, model_name: str | None = None,
                              default_backbone: dict | None = None, **encoder_kwargs) -> dict:
    """Write a checkpoint's backbone as a detectron2 weight file; return its name, depth and size.

    The file is ``{'model': {name: array}, '__author__': 'ifnd', 'matching_heuristics': True}``:
    detectron2's checkpointer then matches ``res2.0.conv1.weight`` to
    ``backbone.res2.0.conv1.weight`` and, in C4 models, ``res5.*`` to ``roi_heads.res5.*``.
    ``model_name`` overrides the checkpoint's backbone; ``default_backbone`` is how to read files
    that carry no model config (MoCo, torchvision); ``encoder_kwargs`` (``num_heads``,
    ``cifar_stem``) as :func:`load_encoder`'s.
    """
    # Building the encoder checks every key and shape against the named backbone.
    encoder = load_encoder(checkpoint_path, model_name=model_name,
                           default_backbone=default_backbone, **encoder_kwargs)
    timm_model = encoder.backbone.model
    state = timm_model.state_dict()
    model = to_detectron2(state)
    depth = resnet_depth(state)
    buffer = io.BytesIO()
    _PortablePickler(buffer, protocol=4).dump(
        {'model': model, '__author__': 'ifnd', 'matching_heuristics': True})
    AtomicLocalBackend().put(buffer.getvalue(), out)
    name = getattr(timm_model, 'pretrained_cfg', {}).get('architecture') or model_name
    return {'out': out, 'model_name': name, 'depth': depth, 'num_tensors': len(model)}
