"""Write a checkpoint's backbone alone, with the settings needed to rebuild it.

The output is ``{'state_dict': <timm key names>, 'meta': {'model': {'backbone': ...,
'data_preprocessor': ...}}}``: plain tensors and Python data, so ``torch.load(weights_only=True)``
and ``ifnd.models.load_encoder(OUT)`` read it without further arguments. The input is anything
the encoder loader reads (a training checkpoint; MoCo, PCL, solo-learn, mmselfsup, VISSL,
torchvision or timm weights); the ResNet of files without a model config is read from the
weights, ``--model-name`` settles the names they leave open (e.g. resnet50d variants).

    python tools/extract_backbone.py work_dirs/ifnd_r50_200e_in1k/epoch_200.pth ifnd_r50.pth
    python tools/extract_backbone.py moco_v2_800ep_pretrain.pth.tar moco_r50.pth
"""
from __future__ import annotations

import argparse
import io
import os.path as osp

import torch

from ifnd.engine.arguments import add_encoder_arguments, check_arguments, encoder_options
from ifnd.engine.input_errors import input_errors_as_messages
from ifnd.fileio import AtomicLocalBackend, config_to_data
from ifnd.models.encoder import load_encoder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description='Save the backbone weights of a checkpoint.')
    parser.add_argument('checkpoint', help='training checkpoint, backbone file, or peer checkpoint '
                        '(MoCo, PCL, solo-learn, mmselfsup, VISSL, torchvision/timm)')
    parser.add_argument('out', help='output file (.pth)')
    add_encoder_arguments(parser)
    return parser.parse_args(argv)


def extract_backbone(checkpoint_path: str, out: str, **encoder_kwargs) -> dict:
    """Write the backbone-only file ``out`` atomically and return what was written;
    ``encoder_kwargs`` (``model_name``, ``num_heads``, ``cifar_stem``) as ``load_encoder``'s."""
    # Building the encoder checks every key and shape against the named backbone.
    encoder = load_encoder(checkpoint_path, **encoder_kwargs)
    state = {k: v.detach().clone().contiguous() for k, v in encoder.backbone.model.state_dict().items()}
    result = {
        'state_dict': state,
        # The architecture alone ('pretrained' is the loaders' own setting): what readers keep.
        'meta': {'model': {'backbone': config_to_data({k: v for k, v in encoder.backbone_cfg.items()
                                                       if k != 'pretrained'}),
                           'data_preprocessor': config_to_data(encoder.data_preprocessor_cfg)},
                 'source': osp.abspath(checkpoint_path)},
    }
    buffer = io.BytesIO()
    torch.save(result, buffer)
    AtomicLocalBackend().put(buffer.getvalue(), out)
    return result


def main(argv: list[str] | None = None) -> None:
    """Extract and report."""
    args = parse_args(argv)
    check_arguments(inputs={'checkpoint': args.checkpoint}, outputs={'out': args.out})
    with input_errors_as_messages():
        result = extract_backbone(args.checkpoint, args.out, **encoder_options(args))
    backbone = result['meta']['model']['backbone']
    print(f"{args.out}: {len(result['state_dict'])} tensors of {backbone.get('model_name')} "
          f"(cifar_stem={backbone.get('cifar_stem', False)})")


if __name__ == '__main__':
    main()
