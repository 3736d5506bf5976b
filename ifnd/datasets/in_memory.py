"""Data sets held in memory as uint8 arrays: CIFAR-10/100, Fashion-MNIST and scikit-learn's digits."""
from __future__ import annotations

import gzip
import os.path as osp
from typing import Any

import numpy as np
import torch
from PIL import Image

from ifnd.device import to_device
from ifnd.registry import DATASETS
from .base import ContrastiveDataset, data_device
from .device_augment import to_float_rgb
from .transforms import EvalView, PipelineCfg

FASHION_MNIST_CLASSES = ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker',
                         'Bag', 'Ankle boot']

# IDX type codes -> big-endian numpy dtypes.
_IDX_DTYPES = {0x08: '>u1', 0x09: '>i1', 0x0B: '>i2', 0x0C: '>i4', 0x0D: '>f4', 0x0E: '>f8'}


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (as used by MNIST / Fashion-MNIST), gzipped or not, into a numpy array."""
    with open(path, 'rb') as f:
        raw = f.read()
    try:
        if raw[:2] == b'\x1f\x8b':
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise ValueError(f"'{path}' is not a valid gzip file ({e}); delete it and fetch it again") from e
    if len(raw) < 4 or raw[:2] != b'\x00\x00' or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"'{path}' is not an IDX file (bad header); delete it and fetch it again")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype='>i4', count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    offset = 4 + 4 * ndim
    if len(raw) - offset != int(np.prod(shape)) * dtype.itemsize:
        raise ValueError(f"'{path}' is truncated or corrupt: header says shape {shape}; fetch it again")
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(shape).astype(dtype.newbyteorder('='))


class _InMemoryDataset(ContrastiveDataset):
    """Base for datasets held as a uint8 array ``[N, H, W]`` or ``[N, H, W, 3]``."""

    data: np.ndarray
    _images: dict[torch.device, torch.Tensor]

    def _read_image(self, j: int) -> Image.Image:
        return Image.fromarray(self.data[j])

    def images(self, device: torch.device | str = 'cpu') -> torch.Tensor:
        """This data set's images as one uint8 tensor ``[N, C, H, W]`` on ``device`` (kept after the first call)."""
        device = torch.device(device)
        cache = self.__dict__.setdefault('_images', {})
        if device not in cache:
            t = torch.from_numpy(np.ascontiguousarray(self.data[self.indices]))
            t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2).contiguous()
            cache[device] = t.to(device)
        return cache[device]

    def _labels_on(self, device: torch.device) -> torch.Tensor:
        """This data set's labels ``[N]`` on ``device`` (kept after the first call)."""
        cache = self.__dict__.setdefault('_device_labels', {})
        if device not in cache:
            cache[device] = torch.from_numpy(self.labels).to(device)
        return cache[device]

    def _raw_batch(self, idx: np.ndarray) -> dict[str, Any]:
        # Images and labels are held on the device: the batch is gathered there from its indices, copied
        # without a host wait, so the host can queue this step while the device runs the previous one.
        images = self.images(data_device())
        index = to_device(torch.from_numpy(idx), images.device)
        return {'inputs': images[index], 'index': index, 'label': self._labels_on(images.device)[index]}

    @property
    def evaluates_on_device(self) -> bool:
        """Whether feature extraction reads this data set as uint8 batches on the model's device:
        its images are held there for device augmentation and its pipeline is an ``EvalView``
        (which applies to uint8 tensor batches as to PIL images)."""
        return self.augment_on == 'device' and isinstance(self.pipeline, EvalView)

    def eval_batch(self, idx: torch.Tensor, device: torch.device | str) -> dict[str, Any]:
        """Items ``idx`` (a CPU index tensor) under the eval view, made on ``device`` from the images
        held there: ``{'inputs': [float32 RGB [B, 3, h, w] in [0, 1]], 'index', 'label'}``."""
        images = self.images(device)
        views = self.pipeline(images[idx.to(images.device)]).as_subclass(torch.Tensor)
        labels = torch.from_numpy(self.labels[idx.numpy()])
        return {'inputs': [to_float_rgb(views)], 'index': idx, 'label': labels}


class _TorchvisionCIFAR(_InMemoryDataset):
    _tv_name = 'CIFAR10'

    def __init__(self,
                 data_root: str,
                 split: str = 'train',
                 download: bool = False,
                 pipeline: PipelineCfg = None,
                 subset_fraction: float | None = None,
                 subset_file: str | None = None,
                 subset_seed: int = 0,
                 augment_on: str = 'cpu') -> None:
        import torchvision.datasets as tvd
        if split not in ('train', 'test'):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        tv_cls = getattr(tvd, self._tv_name)
        folder = osp.join(str(data_root), tv_cls.base_folder)
        hint = (f"place torchvision's '{tv_cls.base_folder}' folder (extracted from {tv_cls.filename}) in "
                f"'{data_root}', or pass download=True")
        if not download and not osp.isdir(folder):
            raise FileNotFoundError(f"{type(self).__name__} data not found: '{folder}' does not exist; {hint}")
        try:
            tv = tv_cls(str(data_root), train=split == 'train', download=download)
        except RuntimeError as e:  # torchvision reports missing files and md5 mismatches alike
            raise FileNotFoundError(f"{type(self).__name__} files in '{folder}' are missing or corrupt ({e}); "
                                    f'{hint}') from e
        self.data_root, self.split = str(data_root), split
        self.data = np.ascontiguousarray(tv.data, dtype=np.uint8)
        self._all_labels = np.asarray(tv.targets, dtype=np.int64)
        self.classes = list(tv.classes)
        super().__init__(pipeline, subset_fraction, subset_file, subset_seed, augment_on)


@DATASETS.register_module()
class CIFAR10(_TorchvisionCIFAR):
    """CIFAR-10 read from torchvision's ``cifar-10-batches-py`` folder into memory."""

    _tv_name = 'CIFAR10'


@DATASETS.register_module()
class CIFAR100(_TorchvisionCIFAR):
    """CIFAR-100 (fine labels) read from torchvision's ``cifar-100-python`` folder into memory."""

    _tv_name = 'CIFAR100'


@DATASETS.register_module()
class FashionMNIST(_InMemoryDataset):
    """Fashion-MNIST read from IDX files in ``data_root`` or ``data_root/FashionMNIST/raw``."""

    def __init__(self,
                 data_root: str = '/usr/share/datasets/fashion-mnist',
                 split: str = 'train',
                 download: bool = False,
                 pipeline: PipelineCfg = None,
                 subset_fraction: float | None = None,
                 subset_file: str | None = None,
                 subset_seed: int = 0,
                 augment_on: str = 'cpu') -> None:
        if split not in ('train', 'test'):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self.data_root, self.split = str(data_root), split
        prefix = 'train' if split == 'train' else 't10k'
        files = self._find_files(prefix)
        if files is None and download:
            import torchvision.datasets as tvd
            tvd.FashionMNIST(self.data_root, train=split == 'train', download=True)
            files = self._find_files(prefix)
        if files is None:
            raise FileNotFoundError(
                f"Fashion-MNIST files '{prefix}-images-idx3-ubyte[.gz]' and '{prefix}-labels-idx1-ubyte[.gz]' "
                f"not found in '{self.data_root}' or '{osp.join(self.data_root, 'FashionMNIST', 'raw')}'; "
                "install them with `apt-get install dataset-fashion-mnist` (data_root "
                "'/usr/share/datasets/fashion-mnist') or pass download=True")
        images, labels = read_idx(files[0]), read_idx(files[1])
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(f"Fashion-MNIST files '{files[0]}' {images.shape} and '{files[1]}' {labels.shape} "
                             'do not match; fetch them again')
        self.data = np.ascontiguousarray(images, dtype=np.uint8)
        self._all_labels = labels.astype(np.int64)
        self.classes = list(FASHION_MNIST_CLASSES)
        super().__init__(pipeline, subset_fraction, subset_file, subset_seed, augment_on)

    def _find_files(self, prefix: str) -> tuple[str, str] | None:
        for folder in (self.data_root, osp.join(self.data_root, 'FashionMNIST', 'raw')):
            found = []
            for stem in (f'{prefix}-images-idx3-ubyte', f'{prefix}-labels-idx1-ubyte'):
                found += [p for p in (osp.join(folder, stem), osp.join(folder, stem + '.gz')) if osp.isfile(p)][:1]
            if len(found) == 2:
                return found[0], found[1]
        return None


@DATASETS.register_module()
class Digits(_InMemoryDataset):
    """scikit-learn's bundled 8x8 digits, split into stratified train/test parts reproducibly by ``seed``."""

    def __init__(self,
                 split: str = 'train',
                 test_fraction: float = 0.25,
                 seed: int = 0,
                 pipeline: PipelineCfg = None,
                 subset_fraction: float | None = None,
                 subset_file: str | None = None,
                 subset_seed: int = 0,
                 augment_on: str = 'cpu') -> None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        if split not in ('train', 'test', 'all'):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        digits = load_digits()
        images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
        targets = digits.target.astype(np.int64)
        keep = np.arange(len(targets))
        if split != 'all':
            train, test = train_test_split(keep, test_size=test_fraction, stratify=targets, random_state=seed)
            keep = np.sort(train if split == 'train' else test)
        self.split = split
        self.data = np.ascontiguousarray(images[keep])
        self._all_labels = targets[keep]
        self.classes = [str(c) for c in range(10)]
        super().__init__(pipeline, subset_fraction, subset_file, subset_seed, augment_on)
