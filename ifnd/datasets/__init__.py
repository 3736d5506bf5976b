"""Datasets yielding ``{'inputs': list[Tensor], 'index': int, 'label': int}`` and their view transforms."""
from .datasets import (CIFAR10, CIFAR100, FASHION_MNIST_CLASSES, IMG_EXTENSIONS, ContrastiveDataset,
                       CorruptImageError, Digits, FashionMNIST, ImageFolder, ImageNet, balanced_subset_indices,
                       read_idx)
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
