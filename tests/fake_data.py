"""Small generated data sets in the on-disk formats the readers expect."""
import gzip
import os
import pickle
import struct

import numpy as np
from PIL import Image


def rgb_image(seed: int, size=(12, 10)) -> Image.Image:
    """A random RGB image."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def write_idx(path, array: np.ndarray, gz: bool):
    codes = {np.dtype(np.uint8): 0x08}
    header = struct.pack('>BBBB', 0, 0, codes[array.dtype], array.ndim)
    header += struct.pack(f'>{array.ndim}i', *array.shape)
    raw = header + array.tobytes()
    with (gzip.open if gz else open)(path, 'wb') as f:
        f.write(raw)


def fake_fmnist(folder, n_train=12, n_test=6, gz=True):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    ext = '.gz' if gz else ''
    for prefix, n in (('train', n_train), ('t10k', n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        write_idx(os.path.join(folder, f'{prefix}-images-idx3-ubyte{ext}'), images, gz)
        write_idx(os.path.join(folder, f'{prefix}-labels-idx1-ubyte{ext}'), labels, gz)
        arrays[prefix] = (images, labels)
    return arrays


def fake_cifar(root, n_per_batch=4, num_classes=10):
    """torchvision's CIFAR-10 (``cifar-10-batches-py``) or CIFAR-100 (``cifar-100-python``) files."""
    rng = np.random.default_rng(0)
    if num_classes == 10:
        folder, label_key, names_key = root / 'cifar-10-batches-py', 'labels', 'label_names'
        files, meta = [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch'], 'batches.meta'
    else:
        folder, label_key, names_key = root / 'cifar-100-python', 'fine_labels', 'fine_label_names'
        files, meta = ['train', 'test'], 'meta'
    folder.mkdir(parents=True)
    for name in files:
        entry = {'data': rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8),
                 label_key: list(rng.integers(0, num_classes, n_per_batch))}
        with open(folder / name, 'wb') as f:
            pickle.dump(entry, f)
    with open(folder / meta, 'wb') as f:
        pickle.dump({names_key: [f'class{i}' for i in range(num_classes)]}, f)


def voc_targets(rng: np.random.Generator, num: int) -> np.ndarray:
    """VOC07 labels ``[num, 20]`` (1 positive, -1 negative, 0 difficult), each class with at least
    3 positives and 3 negatives (3-fold CV needs them)."""
    targets = rng.choice(np.array([1, -1, 0], dtype=np.int8), size=(num, 20), p=[0.3, 0.55, 0.15])
    for c in range(20):
        targets[rng.choice(num, 3, replace=False), c] = 1
        targets[rng.choice(np.flatnonzero(targets[:, c] != 1), 3, replace=False), c] = -1
    return targets


def fake_vocdevkit(root, rng: np.random.Generator, num_trainval: int, num_test: int):
    """VOCdevkit/VOC2007 under ``root`` with tiny JPEGs whose colour depends a little on their
    classes; returns the VOCdevkit folder and each split's (image ids, targets)."""
    from ifnd.datasets import VOC_CLASSES
    voc = root / 'VOCdevkit' / 'VOC2007'
    (voc / 'ImageSets' / 'Main').mkdir(parents=True)
    (voc / 'JPEGImages').mkdir()
    palette = rng.integers(0, 256, (20, 3))
    splits = {}
    start = 1
    for split, num in (('trainval', num_trainval), ('test', num_test)):
        ids = [f'{i:06d}' for i in range(start, start + num)]
        start += num
        targets = voc_targets(rng, num)
        for c, name in enumerate(VOC_CLASSES):
            with open(voc / 'ImageSets' / 'Main' / f'{name}_{split}.txt', 'w') as f:
                f.writelines(f'{i} {int(t):2d}\n' for i, t in zip(ids, targets[:, c]))
        for i, row in zip(ids, targets):
            colour = palette[row == 1].mean(axis=0)
            pixels = np.clip(colour + rng.normal(0, 40, (36, 40, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(voc / 'JPEGImages' / f'{i}.jpg', quality=90)
        splits[split] = (ids, targets)
    return str(root / 'VOCdevkit'), splits
