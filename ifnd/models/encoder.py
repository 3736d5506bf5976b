"""The pre-trained encoder used by every evaluation: a backbone, its preprocessing and its weights.

Weights come from any of the layouts in ``CHECKPOINT_LAYOUTS``: this project's training
checkpoints and backbone-only files (which carry their backbone config), MoCo v1/v2/v3, PCL,
HCSC, solo-learn, mmselfsup/mmpretrain, VISSL, DINO, and torchvision/timm state dicts. Files
without a config have their ResNet or ViT architecture read from the weights' keys and shapes
(:func:`infer_backbone_config`).
"""
import copy
import inspect
import re

import timm
import torch
import torch.nn.functional as F
from mmengine.model import BaseModel

from ifnd.fileio import read_checkpoint as load_checkpoint_file  # the tools' name for it
from ifnd.fileio.checkpoint import check_weights
from ifnd.fileio.checkpoint_layouts import backbone_state, key_prefixes
from ifnd.models.architecture import checkpoint_architecture
from ifnd.models.backbones import ViTBackbone
from ifnd.models.vit_architecture import (HEADS_FIX, ImpossibleWeights, UnstatedHeads,
                                          checkpoint_num_heads, infer_vit_config, is_vit_state,
                                          vit_defaults, vit_shapes)
from ifnd.registry import MODELS

IMAGENET_PREPROCESSOR = dict(type='ContrastiveDataPreprocessor', mean=(0.485, 0.456, 0.406),
                             std=(0.229, 0.224, 0.225))
# timm ResNet stage widths and stem width when not reduced.
RESNET_CHANNELS = (64, 128, 256, 512)
RESNET_STEM_WIDTH = 64
MODEL_NAME_HINT = 'pass --model-name NAME (model_name=NAME in Python)'


@MODELS.register_module()
class Encoder(BaseModel):
    """A backbone alone with its data preprocessor: features f(x) for evaluation."""

    def __init__(self, backbone: dict, data_preprocessor: dict | None = None,
                 init_cfg: dict | None = None) -> None:
        data_preprocessor = copy.deepcopy(dict(data_preprocessor or IMAGENET_PREPROCESSOR))
        super().__init__(data_preprocessor=MODELS.build(data_preprocessor), init_cfg=init_cfg)
        self.backbone_cfg = copy.deepcopy(dict(backbone))  # what rebuilds this backbone
        self.data_preprocessor_cfg = data_preprocessor
        self.backbone = MODELS.build(backbone)

    def extract_feat(self, inputs: torch.Tensor) -> torch.Tensor:
        """Backbone features f(x)."""
        return self.backbone(inputs)

    @torch.no_grad()
    def clustering_features(self, inputs: torch.Tensor, feature: str = 'f') -> torch.Tensor:
        """L2-normalised backbone features (an encoder has no projection head, so no 'z')."""
        if feature != 'f':
            raise ValueError(f"an Encoder gives backbone features only (feature='f'), got {feature!r}")
        return F.normalize(self.extract_feat(inputs).float(), dim=1)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        """Backbone features of the first view."""
        views = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        return self.extract_feat(views)


def _signature(state: dict) -> dict[str, tuple]:
    # num_batches_tracked is absent from old torchvision files and carries no weights.
    return {k: tuple(v.shape) for k, v in state.items() if not k.endswith('num_batches_tracked')}


# Key → shape of built backbone configs, by the config's repr: the same candidates recur.
_BUILT_SIGNATURES: dict[str, dict | None] = {}


def backbone_fits(backbone: dict, state: dict[str, torch.Tensor]) -> bool:
    """Whether ``backbone`` (a config) has exactly the keys and shapes of ``state``."""
    cfg = dict(backbone, pretrained=False)
    key = repr(sorted(cfg.items(), key=lambda item: item[0]))
    if key not in _BUILT_SIGNATURES:
        try:
            with torch.device('meta'):  # no memory, no initialisation cost
                module = MODELS.build(cfg)
            _BUILT_SIGNATURES[key] = _signature(getattr(module, 'model', module).state_dict())
        except Exception:  # noqa: BLE001 (a config that does not build does not fit)
            _BUILT_SIGNATURES[key] = None
    return _BUILT_SIGNATURES[key] == _signature(state)


def _resnet_candidates(depth: int) -> list[str]:
    """timm's ResNet-family names of a given depth (resnet50d, wide_resnet50_2, seresnet50...)."""
    pattern = re.compile(rf'(?<!\d){depth}(?!\d)')
    return [n for n in timm.list_models(module='resnet') if pattern.search(n)]


def infer_backbone_config(state: dict[str, torch.Tensor], num_heads: int | None = None) -> dict:
    """The backbone config that rebuilds exactly the ResNet or ViT whose weights ``state`` holds.

    A timm-style Vision Transformer is read by :func:`infer_vit_config` (``num_heads``: the
    attention heads its file or its user states, which its shapes cannot show; without them
    :class:`UnstatedHeads`).

    Reads the block type (basic or bottleneck) and per-stage block counts (hence the depth),
    the stem and stage widths (``stem_width``, ``channels``) and a 3x3 ``conv1`` (the CIFAR stem,
    which comes without max-pooling). Plain ResNets (torchvision's layout) are timm's
    ``resnet{depth}``; other ResNet-family weights are matched against timm's variants, and an
    error lists them when several fit or none does.
    """
    if is_vit_state(state):
        return _vit_config(state, num_heads)
    counts = []
    for stage in range(1, 5):
        blocks = {int(m.group(1)) for k in state if (m := re.match(rf'layer{stage}\.(\d+)\.', k))}
        if not blocks:
            break
        counts.append(max(blocks) + 1)
    stem = state.get('conv1.weight', state.get('conv1.0.weight'))
    if len(counts) != 4 or stem is None or stem.dim() != 4:
        raise ValueError(f'the weights are not a ResNet (keys: {key_prefixes(state, 1, 8)}), so '
                         f'their architecture cannot be read from them: {MODEL_NAME_HINT}, '
                         'e.g. vit_small_patch16_224')
    bottleneck = 'layer1.0.conv3.weight' in state
    depth = 2 + (3 if bottleneck else 2) * sum(counts)
    kind = f'{"bottleneck" if bottleneck else "basic"} blocks {tuple(counts)}'

    cfg = dict(type='TimmBackbone', model_name=f'resnet{depth}')
    last_conv = 'conv3' if bottleneck else 'conv2'
    expansion = 4 if bottleneck else 1
    channels = tuple(state[f'layer{i}.0.{last_conv}.weight'].shape[0] // expansion for i in range(1, 5))
    if channels != RESNET_CHANNELS:
        cfg['channels'] = channels
    if 'conv1.weight' in state:
        if stem.shape[0] != RESNET_STEM_WIDTH:
            cfg['stem_width'] = stem.shape[0]
        if stem.shape[-1] == 3:
            cfg['cifar_stem'] = True
    if stem.shape[1] != 3:
        cfg['in_chans'] = stem.shape[1]
    if 'conv1.weight' in state and backbone_fits(cfg, state):
        return cfg

    fits = [name for name in _resnet_candidates(depth)
            if backbone_fits(dict(type='TimmBackbone', model_name=name), state)]
    if len(fits) == 1:
        return dict(type='TimmBackbone', model_name=fits[0])
    stem_kind = 'a deep stem (conv1.0, conv1.1, ...)' if 'conv1.0.weight' in state else 'a single conv1'
    if fits:
        raise ValueError(f'the weights are a ResNet-{depth} ({kind}, {stem_kind}) that fits several '
                         f'timm models equally: {", ".join(fits)}; {MODEL_NAME_HINT} with the one '
                         'it was trained as')
    raise ValueError(f'the weights are a ResNet-{depth}-like network ({kind}, {stem_kind}) that no '
                     f'timm ResNet variant of that depth matches exactly (tried '
                     f'{", ".join(_resnet_candidates(depth)) or "none"}); {MODEL_NAME_HINT} and the '
                     'options it needs')


def _vit_config(state: dict[str, torch.Tensor], num_heads: int | None) -> dict:
    """The ``ViTBackbone`` config of ViT weights, refused unless it has exactly their keys and shapes."""
    try:
        cfg = infer_vit_config(state, num_heads)
    except UnstatedHeads:
        raise
    except ValueError as err:
        fix = '' if isinstance(err, ImpossibleWeights) else f'; {MODEL_NAME_HINT}'
        raise ValueError(f'the weights are a Vision Transformer whose architecture cannot be read '
                         f'from them: {err}{fix}') from None
    if not backbone_fits(cfg, state):
        raise ValueError(f'the weights are a Vision Transformer that {cfg} does not match exactly '
                         f'(keys: {key_prefixes(state, 1, 8)}); {MODEL_NAME_HINT} and the options '
                         'it needs')
    return cfg


def _mismatch_error(backbone: torch.nn.Module, state: dict, source: str) -> ValueError:
    target = backbone.model.state_dict()
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    wrong_shape = sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(target[k].shape)}'
                         for k in set(state) & set(target) if state[k].shape != target[k].shape)

    def listing(keys):
        return ', '.join(keys[:12]) + (f' ... ({len(keys)} in all)' if len(keys) > 12 else '')
    try:
        hint = (f'The weights are a Vision Transformer {vit_shapes(state)}' if is_vit_state(state)
                else f'The weights are {infer_backbone_config(state)}')
    except ValueError as err:
        hint = str(err)[0].upper() + str(err)[1:]
    return ValueError(
        f'{source} does not match the backbone {type(backbone.model).__name__}: '
        f'missing keys [{listing(missing)}]; unexpected keys [{listing(unexpected)}]; '
        f'shape mismatches [{listing(wrong_shape)}]. {hint}; set the backbone options '
        '(model_name, cifar_stem, channels...) to match')


def load_backbone_weights(backbone: torch.nn.Module, path: str, checkpoint: dict | None = None) -> None:
    """Load a checkpoint's backbone into a ``TimmBackbone``, failing loudly on any mismatch.

    ``checkpoint`` is the already loaded content of ``path``, when the caller has it. Every reader
    of backbone weights ends here, so weights that would load but compute nothing (non-finite
    values, integers in place of floating-point weights) are refused here (:func:`check_weights`).
    """
    state = backbone_state(checkpoint if checkpoint is not None else load_checkpoint_file(path), path)
    target = backbone.model.state_dict()
    for key in set(target) - set(state):  # files from before BatchNorm counted its batches
        if key.endswith('num_batches_tracked'):
            state[key] = torch.zeros_like(target[key])
    if set(state) != set(target) or any(state[k].shape != target[k].shape for k in state):
        raise _mismatch_error(backbone, state, path)
    check_weights(state, target, path)
    backbone.model.load_state_dict(state, strict=True)


def backbone_num_heads(backbone: dict | None) -> int | None:
    """The attention heads a backbone config builds (its ``num_heads``, else its timm name's),
    None for a network without them."""
    if not backbone:
        return None
    if backbone.get('num_heads') is not None:
        return backbone['num_heads']
    name = backbone.get('model_name')
    if name is None and backbone.get('type') == 'ViTBackbone':  # its own default network
        name = inspect.signature(ViTBackbone).parameters['model_name'].default
    defaults = vit_defaults(name) if isinstance(name, str) else None
    return defaults['num_heads'] if defaults else None


def stated_num_heads(checkpoint: dict, architecture: dict | None) -> int | None:
    """The attention heads a checkpoint states for its ViT: those of its config's backbone
    (``architecture``, as :func:`checkpoint_architecture` reads it), else MoCo v3's ``arch``."""
    return backbone_num_heads((architecture or {}).get('backbone')) or checkpoint_num_heads(checkpoint)


def _with_num_heads(backbone: dict, num_heads: int | None, stated: int | None, source: str) -> dict:
    """``backbone`` with the heads the user gives, refused where the file states others or the
    network has none (a flag that changes nothing, or contradicts the file, is a slip)."""
    if num_heads is None:
        return backbone
    if backbone_num_heads(backbone) is None and backbone.get('type') != 'ViTBackbone':
        raise ValueError(f'--num-heads {num_heads} (num_heads): {source} holds a '
                         f'{backbone.get("model_name", "network")}, which has no attention heads; '
                         'leave it out')
    if stated is not None and stated != num_heads:
        raise ValueError(f'--num-heads {num_heads} (num_heads): {source} states {stated} attention '
                         'heads for its ViT (its config, or its arch); leave it out')
    return dict(backbone, num_heads=num_heads)


def resolve_backbone_config(checkpoint: dict, source: str = 'checkpoint', model_name: str | None = None,
                            default_backbone: dict | None = None, architecture: dict | None = None,
                            num_heads: int | None = None, **backbone_kwargs) -> dict:
    """The backbone config that rebuilds a checkpoint's backbone, explicit settings applied last.

    In order: the architecture the checkpoint's config describes (``architecture``, when the
    caller has read it with :func:`checkpoint_architecture`); else ``default_backbone`` when it
    fits the weights exactly; else what :func:`infer_backbone_config` reads from the weights;
    ``model_name`` settles a name the weights leave open (its stem and width still come from
    the weights). A ViT's attention heads, which no shape shows, come from the file (its config,
    MoCo v3's ``arch``) or ``num_heads``; with neither, one line asks for them.
    """
    if architecture is None:
        architecture = checkpoint_architecture(checkpoint, source)
    stated = stated_num_heads(checkpoint, architecture)
    own = (architecture or {}).get('backbone')
    if own:
        backbone = copy.deepcopy(dict(own))
        if model_name is not None:
            backbone['model_name'] = model_name
    else:
        state = backbone_state(checkpoint, source)
        default = copy.deepcopy(dict(default_backbone or {}))
        if model_name is not None:
            default['model_name'] = model_name
        default.setdefault('type', 'TimmBackbone')
        if 'model_name' in default and backbone_fits(dict(default, **backbone_kwargs), state):
            backbone = default
            if stated is not None and backbone_num_heads(default) not in (None, stated):
                backbone['num_heads'] = stated  # the same shapes: the file's heads, not the name's
        else:
            try:
                backbone = infer_backbone_config(state, num_heads or stated)
            except UnstatedHeads as err:
                raise ValueError(f'{source} holds {err}: {HEADS_FIX}') from None
            except ValueError as err:
                if 'model_name' not in default:
                    raise ValueError(f'{source}: {err}') from None
                backbone = default  # the weights cannot say; the given name is loaded as is
            else:
                if model_name is not None:
                    backbone['model_name'] = model_name
    backbone = _with_num_heads(backbone, num_heads, stated, source)
    backbone.update(backbone_kwargs)
    backbone['pretrained'] = False  # the weights come from the checkpoint, never from timm's hub
    return backbone


def load_encoder(path: str, model_name: str | None = None, data_preprocessor: dict | None = None,
                 default_backbone: dict | None = None, num_heads: int | None = None,
                 **backbone_kwargs) -> Encoder:
    """An ``Encoder`` with a checkpoint's backbone weights, in any layout of ``CHECKPOINT_LAYOUTS``.

    The backbone comes from :func:`resolve_backbone_config`: the checkpoint's own config (ours
    carry one), else ``default_backbone`` if it fits, else the ResNet or ViT the weights describe
    (a ViT's attention heads from the file or ``num_heads``). ``model_name`` and
    ``backbone_kwargs`` (e.g. ``cifar_stem``) override.
    """
    checkpoint = load_checkpoint_file(path)
    architecture = checkpoint_architecture(checkpoint, path) or {}
    backbone = resolve_backbone_config(checkpoint, path, model_name, default_backbone,
                                       architecture, num_heads, **backbone_kwargs)
    encoder = Encoder(backbone, data_preprocessor or architecture.get('data_preprocessor'))
    load_backbone_weights(encoder.backbone, path, checkpoint)
    return encoder
