"""Image datasets that yield augmented views together with their index and ground-truth label.

Each item is ``{'inputs': list[Tensor], 'index': int, 'label': int}``: ``inputs`` holds one float32
``[3, H, W]`` tensor per view, ``index`` is the item's position in this (possibly subsetted) dataset,
which lets false-negative detection key pseudo-labels by sample, and ``label`` is -1 when unknown.
"""
from __future__ import annotations

import gzip
import os
import os.path as osp
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from mmengine.dataset import default_collate
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from ifnd.registry import DATASETS, FUNCTIONS
from .device_augment import CorruptImageError, device_views_of, to_float_rgb
from .transforms import EvalView, PipelineCfg, build_pipeline

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.pgm', '.bmp', '.tif', '.tiff', '.webp')

FASHION_MNIST_CLASSES = ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker',
                         'Bag', 'Ankle boot']

# IDX type codes -> big-endian numpy dtypes.
_IDX_DTYPES = {0x08: '>u1', 0x09: '>i1', 0x0B: '>i2', 0x0C: '>i4', 0x0D: '>f4', 0x0E: '>f8'}

AUGMENT_ON = ('cpu', 'device')


@FUNCTIONS.register_module()
def batch_collate(data: Sequence[Any] | Mapping) -> Any:
    """Collate a list of items like ``default_collate``; a batch a dataset's ``__getitems__`` made passes through."""
    return data if isinstance(data, Mapping) else default_collate(data)


def data_device() -> torch.device:
    """Where an in-memory data set keeps its images for device augmentation: the current CUDA device, else CPU."""
    if torch.cuda.is_available() and get_worker_info() is None:  # loader workers must not touch CUDA
        return torch.device('cuda', torch.cuda.current_device())
    return torch.device('cpu')


def balanced_subset_indices(labels: Sequence[int] | np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Return sorted indices of a class-balanced random subset holding ``fraction`` of each class.

    Each class keeps ``max(1, round(fraction * n_c))`` items (-1, unknown, counts as one class).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f'subset_fraction must be in (0, 1], got {fraction}')
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    chosen = []
    for c in np.unique(labels):  # sorted, so the draw order (and the result) depends only on the seed
        idx = np.flatnonzero(labels == c)
        k = max(1, int(np.floor(fraction * len(idx) + 0.5)))
        chosen.append(rng.choice(idx, size=k, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


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


class ContrastiveDataset(Dataset):
    """Base class: subsetting, pipeline and the ``{'inputs', 'index', 'label'}`` item format.

    With ``augment_on='device'`` and a contrastive training pipeline (a ``ContrastiveView``-type view or
    a ``MultiView`` of them), ``__getitems__`` returns whole batches of un-augmented images (uint8
    ``[B, C, H, W]``, or encoded files) with the pipeline config under ``'augment'``; the model's
    ``ContrastiveDataPreprocessor`` makes the views on the device. Other pipelines (e.g. ``EvalView``
    in evaluation hooks) keep the CPU path.

    Subclasses load their data, set ``_all_labels`` (int array over the full data), ``classes`` and,
    for file-based data, ``_all_names`` (relative paths used by subset files), then call
    ``super().__init__`` and implement ``_read_image(j)`` for a position ``j`` in the full data.
    """

    _all_labels: np.ndarray
    _all_names: Sequence[str] | None = None
    classes: list[str] | None = None

    def __init__(self,
                 pipeline: PipelineCfg = None,
                 subset_fraction: float | None = None,
                 subset_file: str | None = None,
                 subset_seed: int = 0,
                 augment_on: str = 'cpu') -> None:
        if augment_on not in AUGMENT_ON:
            raise ValueError(f"augment_on must be 'cpu' (views made in loader workers) or 'device' (views made "
                             f'in the data preprocessor), got {augment_on!r}')
        self.pipeline = build_pipeline(pipeline)
        self.augment_on = augment_on
        # The config the data preprocessor builds the device views from; None: views made here.
        self.device_pipeline = pipeline if augment_on == 'device' and device_views_of(self.pipeline) else None
        all_labels = np.asarray(self._all_labels, dtype=np.int64)
        if self.classes is not None:
            self.num_classes: int | None = len(self.classes)
        else:
            self.num_classes = int(all_labels.max()) + 1 if all_labels.size and all_labels.max() >= 0 else None
        if subset_fraction is not None and subset_file is not None:
            raise ValueError('Give either subset_fraction or subset_file, not both')
        if subset_fraction is not None:
            self.indices = balanced_subset_indices(all_labels, subset_fraction, subset_seed)
        elif subset_file is not None:
            self.indices = self._read_subset_file(subset_file, len(all_labels))
        else:
            self.indices = np.arange(len(all_labels))
        self.labels = all_labels[self.indices]

    def _read_subset_file(self, path: str, n: int) -> np.ndarray:
        if not osp.isfile(path):
            raise FileNotFoundError(f"Subset file '{path}' does not exist")
        lookup: dict[str, int] = {}
        if self._all_names is not None:
            names = list(self._all_names)
            bases: dict[str, int] = {}
            repeated = set()
            for j, name in enumerate(names):
                base = osp.basename(name)
                if base in bases:
                    repeated.add(base)
                bases[base] = j
            for base in repeated:  # a bare file name found in several folders must not pick one silently
                del bases[base]
            lookup = {**bases, **{name: j for j, name in enumerate(names)}}
        indices = []
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                entry = line.split('#', 1)[0].strip()
                if not entry:
                    continue
                entry = entry.split()[0]
                key = entry[2:] if entry.startswith('./') else entry
                if key in lookup:
                    indices.append(lookup[key])
                elif entry.lstrip('-').isdigit() and 0 <= int(entry) < n:
                    indices.append(int(entry))
                else:
                    raise ValueError(f"Subset file '{path}' line {lineno}: entry '{entry}' is neither a file of "
                                     'this dataset (a bare name must be unique, else give the relative path) '
                                     f'nor an index in [0, {n}); fix or remove that line')
        if not indices:
            raise ValueError(f"Subset file '{path}' lists no entries")
        return np.unique(np.asarray(indices, dtype=np.int64))

    def _read_image(self, j: int) -> Image.Image:
        raise NotImplementedError

    @property
    def metainfo(self) -> dict[str, Any]:
        """Dataset meta information (class names and count) for mmengine's runner and visualizer."""
        return dict(classes=self.classes, num_classes=self.num_classes)

    def __len__(self) -> int:
        return len(self.indices)

    def load_image(self, i: int) -> Image.Image:
        """Return item ``i`` as an RGB PIL image, before any transform."""
        return to_rgb(self._read_image(int(self.indices[i])))

    def __getitem__(self, i: int | tuple[int, int]) -> dict[str, Any]:
        seed = None
        if isinstance(i, tuple):  # (index, augmentation seed) from SeededSampler
            i, seed = i
        if i < 0:
            i += len(self)
        img = self.load_image(i)
        if seed is None:
            views = self.pipeline(img)
        else:
            # The views draw from torch's CPU generator: seed it for this sample alone, leaving the
            # caller's stream (the training process's, when there are no loader workers) as it was.
            # (The generator's own calls: torch.manual_seed and fork_rng cost 100 times more.)
            generator = torch.default_generator
            state = generator.get_state()
            generator.manual_seed(seed)
            try:
                views = self.pipeline(img)
            finally:
                generator.set_state(state)
        if isinstance(views, torch.Tensor):
            views = [views]
        return {'inputs': list(views), 'index': int(i), 'label': int(self.labels[i])}

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]] | dict[str, Any]:
        """Items ``indices``; for device augmentation one batch of raw images and the pipeline to apply."""
        if self.device_pipeline is None:
            return [self[i] for i in indices]
        # SeededSampler's seeds are for views made here; device views draw from the device's generator.
        idx = np.asarray([i[0] if isinstance(i, tuple) else i for i in indices], dtype=np.int64)
        idx[idx < 0] += len(self)
        batch = self._raw_batch(idx)
        batch.update(index=torch.from_numpy(idx), label=torch.from_numpy(self.labels[idx]),
                     augment=self.device_pipeline)
        return batch

    def _raw_batch(self, idx: np.ndarray) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not support augment_on='device'")

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(num_samples={len(self)}, num_classes={self.num_classes}, '
                f'pipeline={self.pipeline})')


# Pillow's modes for 16-bit (and 32-bit integer) single-channel images, e.g. 16-bit grayscale PNGs.
_WIDE_INTEGER_MODES = ('I;16', 'I;16L', 'I;16B', 'I;16N', 'I')


def to_rgb(img: Image.Image) -> Image.Image:
    """An image as 8-bit RGB; 16-bit grayscale keeps its full range, scaled to 8 bits (its top byte).

    Pillow's ``convert('RGB')`` clips 16-bit values at 255; the top byte is what Pillow keeps of
    16-bit RGB files and what the device path takes of every 16-bit image (``decode_images``).
    """
    if img.mode == 'RGB':
        return img
    if img.mode in _WIDE_INTEGER_MODES:
        values = np.clip(np.asarray(img, dtype=np.int64), 0, 65535) >> 8
        img = Image.fromarray(values.astype(np.uint8), mode='L')
    return img.convert('RGB')


def load_rgb_image(path: str, listed_in: str = 'the list file') -> Image.Image:
    """An image file decoded as RGB, with errors that name the file and the fix."""
    try:
        with Image.open(path) as img:
            img.load()  # decode now, so a truncated file fails here with its name, not inside a transform
            return to_rgb(img)
    except FileNotFoundError:
        raise FileNotFoundError(f"Image file '{path}' does not exist; restore it or leave it out of "
                                f'{listed_in}') from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise CorruptImageError(f"Cannot read image '{path}' ({e}); remove or replace the file, or leave it "
                                f'out of {listed_in}') from e


@DATASETS.register_module()
class ImageFolder(ContrastiveDataset):
    """Images under ``data_root/<class>/...`` (sorted folder names give class ids) or listed in ``ann_file``.

    ``classes``: the class folder names in id order, shared by the splits (e.g. train and val) so
    a class without images in one split keeps every id the same; default: the sorted folders that
    hold images.

    ``ann_file`` (absolute or relative to ``data_root``) has lines ``relative/path [label]``; a missing
    label means -1. Images lying directly in ``data_root`` without class folders are unlabelled (-1).
    """

    def __init__(self,
                 data_root: str,
                 ann_file: str | None = None,
                 extensions: Sequence[str] = IMG_EXTENSIONS,
                 pipeline: PipelineCfg = None,
                 subset_fraction: float | None = None,
                 subset_file: str | None = None,
                 subset_seed: int = 0,
                 augment_on: str = 'cpu',
                 classes: Sequence[str] | None = None) -> None:
        self.data_root = str(data_root)
        self.ann_file = ann_file
        if isinstance(classes, str):
            raise ValueError(f'classes must be a list of class folder names, got the string {classes!r}')
        self.requested_classes = list(classes) if classes is not None else None
        if self.requested_classes is not None and len(set(self.requested_classes)) != len(self.requested_classes):
            raise ValueError(f'classes lists a name twice: {self.requested_classes}')
        self.extensions = tuple(e.lower() for e in extensions)
        if ann_file is not None:
            names, labels = self._read_ann_file()
            self.classes = self.requested_classes
        else:
            names, labels = self._scan_folder()
        # A fixed-width bytes array instead of a list of str: no per-item refcounts, so forked
        # dataloader workers do not copy the page holding every path.
        self._names_arr = np.array([n.encode() for n in names])
        self._all_labels = np.asarray(labels, dtype=np.int64)
        super().__init__(pipeline, subset_fraction, subset_file, subset_seed, augment_on)

    @property
    def _all_names(self) -> list[str]:
        return [n.decode() for n in self._names_arr]

    def _missing_root_hint(self) -> str:
        return ("expected class sub-folders 'data_root/<class>/<image>' or ann_file='list.txt' with lines "
                "'relative/path [label]'")

    def _read_ann_file(self) -> tuple[list[str], list[int]]:
        path = self.ann_file if osp.isabs(self.ann_file) else osp.join(self.data_root, self.ann_file)
        if not osp.isfile(path):
            raise FileNotFoundError(f"List file '{path}' does not exist; {self._missing_root_hint()}")
        names, labels = [], []
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith('#'):
                    continue
                parts = line.rsplit(maxsplit=1)
                if len(parts) == 2 and parts[1].lstrip('-').isdigit():
                    names.append(parts[0])
                    labels.append(int(parts[1]))
                else:
                    names.append(line)
                    labels.append(-1)
        if not names:
            raise ValueError(f"List file '{path}' lists no images")
        return names, labels

    def _scan_folder(self) -> tuple[list[str], list[int]]:
        root = self.data_root
        if not osp.isdir(root):
            raise FileNotFoundError(f"Image folder '{root}' does not exist; {self._missing_root_hint()}")

        # Real path of every folder read -> the path it was reached by: a symlink back to a folder
        # already read (a loop, or a second name for one folder) would repeat its images as extra,
        # mislabelled samples.
        visited: dict[str, str] = {}

        def entries_of(folder: str) -> tuple[list[os.DirEntry], list[os.DirEntry]]:
            """The visible sub-folders and files of ``folder`` (sorted), refusing what is not read."""
            real = osp.realpath(folder)
            if real in visited:
                first = visited[real]
                # Reached again below its first path: a loop; elsewhere: a second name for it.
                what = ('a symlink loop: it leads back to' if folder.startswith(first.rstrip(os.sep) + os.sep)
                        else 'the same folder as')
                raise ValueError(f"Image folder '{folder}' is {what} '{first}', so its images would be read "
                                 'again as extra, mislabelled samples; remove the symlink')
            visited[real] = folder
            try:
                with os.scandir(folder) as it:
                    found = sorted(it, key=lambda e: e.name)
            except OSError as e:
                # os.walk skips such folders silently: a class would vanish and every later id shift.
                raise type(e)(f"Cannot read folder '{folder}' ({e.strerror or e}); its images would be left out "
                              f"and later class ids would shift: make it readable (chmod -R u+rX '{folder}') or "
                              f"move it out of '{root}'") from None
            dirs, files = [], []
            for entry in found:
                if entry.name.startswith('.'):
                    continue
                try:
                    is_dir = entry.is_dir()  # follows symlinks, as os.walk(followlinks=True)
                except OSError:
                    is_dir = False
                (dirs if is_dir else files).append(entry)
            return dirs, files

        def images_under(folder: str) -> list[str]:
            # os.walk's order: a folder's files, then each sub-folder's tree, all sorted by name.
            dirs, files = entries_of(folder)
            rel_dir = osp.relpath(folder, root).replace(os.sep, '/')
            found = [f'{rel_dir}/{e.name}' for e in files if e.name.lower().endswith(self.extensions)]
            for entry in dirs:
                found += images_under(entry.path)
            return found

        names, labels, classes = [], [], []
        folders = {entry.name: images_under(entry.path) for entry in entries_of(root)[0]}
        if self.requested_classes is not None:
            unlisted = sorted(name for name, files in folders.items()
                              if files and name not in self.requested_classes)
            if unlisted:
                raise ValueError(f"Image folder '{root}' has class folders not in classes: "
                                 f"{', '.join(unlisted[:5])}{' ...' if len(unlisted) > 5 else ''}; "
                                 'add them to classes or move them out of the folder')
            for name in self.requested_classes:  # the given order; a class without images keeps its id
                files = folders.get(name, [])
                names += files
                labels += [len(classes)] * len(files)
                classes.append(name)
        else:
            for name in sorted(folders):
                if folders[name]:  # empty or non-image folders are not classes
                    names += folders[name]
                    labels += [len(classes)] * len(folders[name])
                    classes.append(name)
        if names:
            self.classes = classes
        else:
            names = [fn for fn in sorted(os.listdir(root))
                     if fn.lower().endswith(self.extensions) and osp.isfile(osp.join(root, fn))]
            labels = [-1] * len(names)
        if not names:
            raise FileNotFoundError(f"No images with extensions {', '.join(self.extensions)} found in '{root}'; "
                                    f'{self._missing_root_hint()}')
        return names, labels

    def get_path(self, i: int) -> str:
        """Return the file path of item ``i``."""
        return osp.join(self.data_root, self._names_arr[int(self.indices[i])].decode())

    def _read_image(self, j: int) -> Image.Image:
        return load_rgb_image(osp.join(self.data_root, self._names_arr[j].decode()))

    def _raw_batch(self, idx: np.ndarray) -> dict[str, Any]:
        # The encoded files: the data preprocessor decodes them together on the device.
        paths = [self.get_path(i) for i in idx]
        return {'inputs': [read_encoded(p) for p in paths], 'path': paths}


def read_encoded(path: str) -> torch.Tensor:
    """The bytes of an image file as a 1-D uint8 tensor, with an error naming a missing file."""
    if not osp.isfile(path):
        raise FileNotFoundError(f"Image file '{path}' does not exist; restore it or leave it out of the data set")
    with open(path, 'rb') as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


@DATASETS.register_module()
class ImageNet(ImageFolder):
    """ImageNet from ``data_root/{train,val}/<wnid>/*.JPEG`` or from list files such as ``meta/train.txt``."""

    def __init__(self,
                 data_root: str,
                 split: str = 'train',
                 ann_file: str | None = None,
                 extensions: Sequence[str] = IMG_EXTENSIONS,
                 pipeline: PipelineCfg = None,
                 subset_fraction: float | None = None,
                 subset_file: str | None = None,
                 subset_seed: int = 0,
                 augment_on: str = 'cpu',
                 classes: Sequence[str] | None = None) -> None:
        self.split = split
        self.imagenet_root = str(data_root)
        if ann_file is None:
            data_root = osp.join(str(data_root), split)
        super().__init__(data_root, ann_file, extensions, pipeline, subset_fraction, subset_file, subset_seed,
                         augment_on, classes)

    def _missing_root_hint(self) -> str:
        return (f"expected ImageNet layout '{self.imagenet_root}/{{train,val}}/<wnid>/*.JPEG', or pass "
                "ann_file='meta/train.txt' (relative to data_root) with lines 'train/n01440764/x.JPEG 0'")


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

    def _raw_batch(self, idx: np.ndarray) -> dict[str, Any]:
        images = self.images(data_device())
        return {'inputs': images[torch.from_numpy(idx).to(images.device)]}

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
