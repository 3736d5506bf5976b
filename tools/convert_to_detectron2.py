"""Write a checkpoint's ResNet backbone as a detectron2 weight file (.pkl) for MODEL.WEIGHTS.

The input is anything the encoder loader reads (a training checkpoint, a backbone file from
tools/extract_backbone.py, MoCo, PCL, solo-learn, mmselfsup, VISSL, torchvision/timm ResNet
weights); the ResNet of files without a model config is read from the weights. The output holds
detectron2's backbone names (stem.conv1.*, res2.* ... res5.*) with numpy arrays and
``matching_heuristics``, so detectron2's checkpointer loads it into a C4 model (res5 into the RoI
head) or an FPN model alike. Set MODEL.RESNETS.DEPTH to the depth printed,
MODEL.RESNETS.STRIDE_IN_1X1 False, INPUT.FORMAT RGB and the ImageNet mean/std in
0-255 units (tools/transfer_coco.py --engine detectron2 does all of this).

    python tools/convert_to_detectron2.py work_dirs/ifnd_r50_200e_in1k/epoch_200.pth ifnd_r50.pkl
    python tools/convert_to_detectron2.py moco_v2_800ep_pretrain.pth.tar moco_r50.pkl
"""
from __future__ import annotations

import argparse

from ifnd.engine.arguments import add_encoder_arguments, check_arguments, encoder_options
from ifnd.engine.input_errors import input_errors_as_messages
from ifnd.transfer import export_detectron2_weights


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint',
                        help='training checkpoint, backbone file, or peer checkpoint (MoCo, PCL, '
                        'solo-learn, mmselfsup, VISSL, torchvision/timm)')
    parser.add_argument('out', help='output file (.pkl)')
    add_encoder_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Convert and report."""
    args = parse_args(argv)
    check_arguments(inputs={'checkpoint': args.checkpoint}, outputs={'out': args.out})
    with input_errors_as_messages():
        result = export_detectron2_weights(args.checkpoint, args.out, **encoder_options(args))
    print(f"{args.out}: {result['num_tensors']} tensors of {result['model_name']} "
          f"(MODEL.RESNETS.DEPTH {result['depth']})")


if __name__ == '__main__':
    main()
