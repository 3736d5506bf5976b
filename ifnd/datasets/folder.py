"""Data sets of image files: a folder of class sub-folders or a list file (``ImageFolder``), and ImageNet."""
from __future__ import annotations

import os
import os.path as osp
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from ifnd.fileio import open_plain
from ifnd.registry import DATASETS
from .base import ContrastiveDataset
from .decode import load_rgb_image, read_encoded_batch
from .transforms import PipelineCfg

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.pgm', '.bmp', '.tif', '.tiff', '.webp')


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
        if not osp.exists(path):  # something else than a file is named when it is opened
            raise FileNotFoundError(f"List file '{path}' does not exist; {self._missing_root_hint()}")
        names, labels = [], []
        with open_plain(path, 'r', 'list file') as f:
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
        walk = _FolderWalk(root, self.extensions)
        folders = {entry.name: walk.images_under(entry.path) for entry in walk.entries_of(root)[0]}
        names, labels, classes = _class_images(root, folders, self.requested_classes)
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
        # The encoded files in one buffer (``'encoded_sizes'``: each file's bytes): the data
        # preprocessor decodes them together on the device.
        paths = [self.get_path(i) for i in idx]
        buffer, sizes = read_encoded_batch(paths)
        return {'inputs': buffer, 'encoded_sizes': sizes, 'path': paths}


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


class _FolderWalk:
    """The images under a data root, read once per real folder, in ``os.walk``'s order."""

    def __init__(self, root: str, extensions: tuple[str, ...]) -> None:
        self.root = root
        self.extensions = extensions
        # Real path of every folder read -> the path it was reached by: a symlink back to a folder
        # already read (a loop, or a second name for one folder) would repeat its images as extra,
        # mislabelled samples.
        self.visited: dict[str, str] = {}

    def entries_of(self, folder: str) -> tuple[list[os.DirEntry], list[os.DirEntry]]:
        """The visible sub-folders and files of ``folder`` (sorted), refusing what is not read."""
        real = osp.realpath(folder)
        if real in self.visited:
            first = self.visited[real]
            # Reached again below its first path: a loop; elsewhere: a second name for it.
            what = ('a symlink loop: it leads back to' if folder.startswith(first.rstrip(os.sep) + os.sep)
                    else 'the same folder as')
            raise ValueError(f"Image folder '{folder}' is {what} '{first}', so its images would be read "
                             'again as extra, mislabelled samples; remove the symlink')
        self.visited[real] = folder
        try:
            with os.scandir(folder) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError as e:
            # os.walk skips such folders silently: a class would vanish and every later id shift.
            raise type(e)(f"Cannot read folder '{folder}' ({e.strerror or e}); its images would be left out "
                          f"and later class ids would shift: make it readable (chmod -R u+rX '{folder}') or "
                          f"move it out of '{self.root}'") from None
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

    def images_under(self, folder: str) -> list[str]:
        """The image files under ``folder``, relative to the root."""
        # os.walk's order: a folder's files, then each sub-folder's tree, all sorted by name.
        dirs, files = self.entries_of(folder)
        rel_dir = osp.relpath(folder, self.root).replace(os.sep, '/')
        found = [f'{rel_dir}/{e.name}' for e in files if e.name.lower().endswith(self.extensions)]
        for entry in dirs:
            found += self.images_under(entry.path)
        return found


def _class_images(root: str, folders: dict[str, list[str]], requested: list[str] | None
                  ) -> tuple[list[str], list[int], list[str]]:
    """The images of the class folders, their labels and the classes, in id order."""
    names, labels, classes = [], [], []
    if requested is not None:
        unlisted = sorted(name for name, files in folders.items() if files and name not in requested)
        if unlisted:
            raise ValueError(f"Image folder '{root}' has class folders not in classes: "
                             f"{', '.join(unlisted[:5])}{' ...' if len(unlisted) > 5 else ''}; "
                             'add them to classes or move them out of the folder')
        for name in requested:  # the given order; a class without images keeps its id
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
    return names, labels, classes
