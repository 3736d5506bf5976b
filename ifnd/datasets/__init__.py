"""Datasets yielding ``{'inputs': list[Tensor], 'index': int, 'label': int}`` and their view transforms.

``base.py``: the items, subsets and pipeline every data set shares; ``folder.py``: image files
(ImageFolder, ImageNet); ``in_memory.py``: CIFAR, Fashion-MNIST, digits; ``voc.py``, ``coco.py``;
``transforms.py``: the CPU views; ``device_augment.py``: the views made on the device;
``decode.py``: image files decoded (Pillow, TorchCodec, torchvision); ``samplers.py``.
"""
from .base import ContrastiveDataset, balanced_subset_indices
from .decode import CorruptImageError
from .folder import IMG_EXTENSIONS, ImageFolder, ImageNet
from .in_memory import CIFAR10, CIFAR100, FASHION_MNIST_CLASSES, Digits, FashionMNIST, read_idx
from .transforms import (ContrastiveView, EvalView, MoCoV2View, MultiView, SimCLRView, build_pipeline,
                         to_float_tensor)

__all__ = [
    'ContrastiveDataset', 'ImageFolder', 'ImageNet', 'CIFAR10', 'CIFAR100', 'FashionMNIST', 'Digits',
    'CorruptImageError', 'balanced_subset_indices', 'read_idx', 'IMG_EXTENSIONS', 'FASHION_MNIST_CLASSES',
    'ContrastiveView', 'SimCLRView', 'MoCoV2View', 'MultiView', 'EvalView', 'build_pipeline', 'to_float_tensor',
]
from .voc import VOC07, VOC_CLASSES  # noqa: E402

__all__ += ['VOC07', 'VOC_CLASSES']
from .coco import AspectRatioBatchSampler, CocoInstances, make_shapes_coco  # noqa: E402
from .samplers import SeededSampler, sample_seed  # noqa: E402

__all__ += ['AspectRatioBatchSampler', 'CocoInstances', 'make_shapes_coco', 'SeededSampler', 'sample_seed']
