"""Write a small COCO-format instance segmentation set of drawn shapes (squares, triangles, ellipses).

It has COCO's layout (annotations/instances_{train,val}2017.json, train2017/, val2017/), polygon and
RLE masks, crowd regions and category ids with gaps, so every COCO tool can run on it on a CPU:

    python tools/make_coco_shapes.py data/coco_shapes
    python tools/transfer_coco.py CKPT --engine torchvision \\
        --config configs/benchmarks/coco/mask_rcnn_c4_tiny_shapes.py --data-root data/coco_shapes
"""
from __future__ import annotations

import argparse

from ifnd.datasets.coco import make_shapes_coco


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('out', help='output folder (the data root)')
    parser.add_argument('--num-train', type=int, default=32, help='training images')
    parser.add_argument('--num-val', type=int, default=16, help='validation images')
    parser.add_argument('--image-size', type=int, default=128, help='side of the square images')
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Generate the data set and say where it is."""
    args = parse_args(argv)
    files = make_shapes_coco(args.out, args.num_train, args.num_val, args.image_size, args.seed)
    for split, path in files.items():
        print(f'{split}: {path}')


if __name__ == '__main__':
    main()
