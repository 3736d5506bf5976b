"""The base of every image data set: subsets, the view pipeline and the ``{'inputs', 'index', 'label'}`` items.

Each item is ``{'inputs': list[Tensor], 'index': int, 'label': int}``: ``inputs`` holds one float32
``[3, H, W]`` tensor per view, ``index`` is the item's position in this (possibly subsetted) dataset,
which lets false-negative detection key pseudo-labels by sample, and ``label`` is -1 when unknown.
"""
from __future__ import annotations

import os.path as osp
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from mmengine.dataset import default_collate
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from ifnd.fileio import open_plain
from ifnd.registry import FUNCTIONS
from ifnd.settings import ReadWhen
from .decode import to_rgb
from .device_augment import device_views_of
from .transforms import PipelineCfg, build_pipeline

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

    read_when = {'subset_seed': ReadWhen('subset_fraction', 'is set', lambda f: f is not None)}

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
        if not osp.exists(path):  # something else than a file is named when it is opened
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
        with open_plain(path, 'r', 'subset file') as f:
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
        if 'index' not in batch:  # not held on the device with the images
            batch.update(index=torch.from_numpy(idx), label=torch.from_numpy(self.labels[idx]))
        batch['augment'] = self.device_pipeline
        return batch

    def _raw_batch(self, idx: np.ndarray) -> dict[str, Any]:
        """The un-augmented images of items ``idx`` (``'inputs'``), and their ``'index'`` and ``'label'``
        where the data set holds them on the device."""
        raise NotImplementedError(f"{type(self).__name__} does not support augment_on='device'")

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(num_samples={len(self)}, num_classes={self.num_classes}, '
                f'pipeline={self.pipeline})')

