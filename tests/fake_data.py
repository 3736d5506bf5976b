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
