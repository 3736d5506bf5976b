"""PASCAL VOC 2007 image classification: 20 classes, multi-label, with "difficult" marks."""
from __future__ import annotations

import os.path as osp

import numpy as np
from PIL import Image

from ifnd.registry import DATASETS
from .base import ContrastiveDataset
from .decode import load_rgb_image
from .transforms import PipelineCfg

VOC_CLASSES = ('aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus', 'car', 'cat', 'chair', 'cow',
               'diningtable', 'dog', 'horse', 'motorbike', 'person', 'pottedplant', 'sheep', 'sofa',
               'train', 'tvmonitor')

VOC_LAYOUT_HINT = ("expected the VOCdevkit layout 'VOCdevkit/VOC2007/ImageSets/Main/<class>_{split}.txt' "
                   "(lines '<image id> <1|-1|0>', one file per class: " + ', '.join(VOC_CLASSES) +
                   ") and 'VOCdevkit/VOC2007/JPEGImages/<image id>.jpg'; pass data_root='VOCdevkit' "
                   "(the folder holding VOC2007/) or the VOC2007 folder itself")


def read_voc_class_file(path: str) -> tuple[list[str], np.ndarray]:
    """Image ids and their labels (1 present, -1 absent, 0 difficult) from one ``<class>_<split>.txt``."""
    ids, labels = [], []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or parts[1] not in ('1', '-1', '0'):
                raise ValueError(f"'{path}' line {lineno}: expected '<image id> <1|-1|0>', "
                                 f'got {line.strip()!r}')
            ids.append(parts[0])
            labels.append(int(parts[1]))
    return ids, np.asarray(labels, dtype=np.int8)


@DATASETS.register_module()
class VOC07(ContrastiveDataset):
    """PASCAL VOC 2007 classification from the VOCdevkit layout; ``targets`` ``[N, 20]`` in {1, -1, 0}.

    ``targets[i, c]`` is 1 when image ``i`` shows class ``c``, -1 when it does not, and 0 when the
    class appears only as "difficult" objects (benchmarks leave those out of the test AP). Items
    follow the usual contract with ``label`` -1, since one image has several classes.
    """

    classes = list(VOC_CLASSES)

    def __init__(self,
                 data_root: str,
                 split: str = 'trainval',
                 pipeline: PipelineCfg = None,
                 subset_fraction: float | None = None,
                 subset_file: str | None = None,
                 subset_seed: int = 0) -> None:
        self.data_root, self.split = str(data_root), split
        self.voc_root = self._find_voc_root(self.data_root)
        main = osp.join(self.voc_root, 'ImageSets', 'Main')
        ids: list[str] | None = None
        columns = []
        for name in VOC_CLASSES:
            path = osp.join(main, f'{name}_{split}.txt')
            if not osp.isfile(path):
                raise FileNotFoundError(f"VOC07 {split} label file '{path}' does not exist; "
                                        f'{VOC_LAYOUT_HINT}')
            class_ids, labels = read_voc_class_file(path)
            if ids is None:
                ids = class_ids
            elif class_ids != ids:
                # The devkit lists the same images in the same order in every class file; anything
                # else means a mixed-up or partly copied folder, and rows would be misaligned.
                raise ValueError(f"'{path}' lists other images (or another order) than "
                                 f"'{osp.join(main, VOC_CLASSES[0] + '_' + split + '.txt')}'; "
                                 'restore the devkit files')
            columns.append(labels)
        if not ids:
            raise ValueError(f"The VOC07 {split} label files in '{main}' list no images")
        self.image_dir = osp.join(self.voc_root, 'JPEGImages')
        if not osp.isdir(self.image_dir):
            raise FileNotFoundError(f"VOC07 image folder '{self.image_dir}' does not exist; "
                                    f'{VOC_LAYOUT_HINT}')
        self._ids_arr = np.array([i.encode() for i in ids])
        self._all_targets = np.stack(columns, axis=1)
        self._all_labels = np.full(len(ids), -1, dtype=np.int64)
        super().__init__(pipeline, subset_fraction, subset_file, subset_seed)
        self.targets = self._all_targets[self.indices]

    @staticmethod
    def _find_voc_root(data_root: str) -> str:
        for root in (osp.join(data_root, 'VOC2007'), data_root):
            if osp.isdir(osp.join(root, 'ImageSets', 'Main')):
                return root
        devkit, voc2007 = (osp.join(root, 'ImageSets', 'Main')
                           for root in (osp.join(data_root, 'VOC2007'), data_root))
        raise FileNotFoundError(f"VOC07 data not found: neither '{devkit}' nor '{voc2007}' exists; "
                                f'{VOC_LAYOUT_HINT}')

    @property
    def _all_names(self) -> list[str]:
        return [i.decode() for i in self._ids_arr]

    @property
    def image_ids(self) -> list[str]:
        """The image ids of the items, in item order."""
        return [self._ids_arr[j].decode() for j in self.indices]

    def get_path(self, i: int) -> str:
        """Return the file path of item ``i``."""
        return osp.join(self.image_dir, self._ids_arr[int(self.indices[i])].decode() + '.jpg')

    def _read_image(self, j: int) -> Image.Image:
        return load_rgb_image(osp.join(self.image_dir, self._ids_arr[j].decode() + '.jpg'))
