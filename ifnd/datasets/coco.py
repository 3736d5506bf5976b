"""COCO-format instance segmentation data: the reader for detection transfer and a generated set."""
from __future__ import annotations

import contextlib
import io
import os
import os.path as osp

import numpy as np
import torch
from mmengine.structures import InstanceData
from PIL import Image, ImageDraw
from pycocotools import mask as mask_util
from torch.utils.data import BatchSampler, Dataset, Sampler
from torchvision import tv_tensors
from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
from torchvision.transforms import v2

from ifnd.fileio import write_json
from ifnd.registry import DATA_SAMPLERS, DATASETS

from .decode import load_rgb_image

COCO_LAYOUT = ('annotations/instances_{train,val}2017.json with the images in train2017/ and '
               'val2017/')
SHAPE_CATEGORIES = ({'id': 1, 'name': 'square'}, {'id': 3, 'name': 'triangle'},
                    {'id': 7, 'name': 'ellipse'})  # ids with gaps, as COCO's


class _CocoImages(CocoDetection):
    """torchvision's COCO reader with errors that name the image file and the fix."""

    def __init__(self, root: str, ann_file: str) -> None:
        super().__init__(root, ann_file)
        self.ann_file = ann_file

    def _load_image(self, id: int) -> Image.Image:
        path = osp.join(self.root, self.coco.loadImgs(id)[0]['file_name'])
        return load_rgb_image(path, listed_in=f'the annotation file {self.ann_file}')


@DATASETS.register_module()
class CocoInstances(Dataset):
    """Images and instance targets of a COCO-format data set, for Mask R-CNN.

    Items are ``{'inputs': uint8 [3, H, W], 'data_samples': InstanceData}`` with ``image_id`` in
    the metainfo; for training the samples hold
    ``boxes`` (XYXY pixels), ``labels`` (1..K, the sorted category ids made contiguous) and
    ``masks`` ``[N, H, W]``, without crowd regions, degenerate boxes or images without objects,
    and with a random horizontal flip. Evaluation items carry only ``image_id``.
    """

    def __init__(self, data_root: str, ann_file: str, img_dir: str, train: bool = False,
                 flip_prob: float = 0.5) -> None:
        ann_path, img_root = osp.join(data_root, ann_file), osp.join(data_root, img_dir)
        for path, what in ((ann_path, 'annotation file'), (img_root, 'image folder')):
            if not osp.exists(path):
                raise FileNotFoundError(
                    f'COCO {what} not found: {path}. The data root should hold {COCO_LAYOUT}; '
                    'pass --data-root DIR, or set ann_file/img_dir of the data set in the config')
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' loading chatter
            self.coco = _CocoImages(img_root, ann_path)
        self.train = train
        self.cat_ids = sorted(self.coco.coco.getCatIds())
        self._label_of = {cat: i + 1 for i, cat in enumerate(self.cat_ids)}
        if train:
            anns = self.coco.coco.imgToAnns
            self.coco.ids = [i for i in self.coco.ids
                             if any(not a.get('iscrowd', 0) for a in anns.get(i, []))]
            if not self.coco.ids:
                raise ValueError(f'{ann_path} has no image with a non-crowd annotation to train on')
            self._targets = wrap_dataset_for_transforms_v2(
                self.coco, target_keys=('image_id', 'boxes', 'labels', 'masks', 'iscrowd'))
            self.transform = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(flip_prob),
                                         v2.SanitizeBoundingBoxes()])

    def __len__(self) -> int:
        return len(self.coco.ids)

    def is_portrait(self, index: int) -> bool:
        """Whether image ``index`` is taller than wide (from the annotations, no decoding)."""
        info = self.coco.coco.imgs[self.coco.ids[index]]
        return info['height'] > info['width']

    def __getitem__(self, index: int) -> dict:
        image_id = self.coco.ids[index]
        if not self.train:
            image = v2.functional.pil_to_tensor(self.coco._load_image(image_id))
            return {'inputs': image, 'data_samples': InstanceData(metainfo={'image_id': image_id})}
        image, target = self._targets[index]
        keep = torch.tensor([not c for c in target.pop('iscrowd')], dtype=torch.bool)
        target['boxes'] = tv_tensors.wrap(target['boxes'][keep], like=target['boxes'])
        target['masks'] = tv_tensors.Mask(target['masks'][keep])
        target['labels'] = torch.tensor([self._label_of[int(c)] for c in target['labels'][keep]],
                                        dtype=torch.int64)
        image, target = self.transform(image, target)
        sample = InstanceData(metainfo={'image_id': image_id},
                              boxes=target['boxes'].as_subclass(torch.Tensor).float(),
                              labels=target['labels'],
                              masks=target['masks'].as_subclass(torch.Tensor).to(torch.uint8))
        return {'inputs': image.as_subclass(torch.Tensor), 'data_samples': sample}


@DATA_SAMPLERS.register_module()
class AspectRatioBatchSampler(BatchSampler):
    """Batches of landscape images or of portrait images, never mixed (detectron2's grouping).

    A batch is padded to its largest image, so grouping by orientation saves most of the padding.
    The dataset must answer ``is_portrait(index)`` (``CocoInstances`` does). Works with finite and
    infinite samplers; a finite one's leftovers form smaller last batches unless ``drop_last``.
    """

    def __init__(self, sampler: Sampler, batch_size: int, drop_last: bool = False) -> None:
        super().__init__(sampler, batch_size, drop_last)
        dataset = getattr(sampler, 'dataset', None)
        if not hasattr(dataset, 'is_portrait'):
            raise TypeError('AspectRatioBatchSampler needs a sampler over a data set with '
                            f'is_portrait(index), such as CocoInstances; got {type(dataset).__name__}')
        self.dataset = dataset

    def __iter__(self):
        buckets: tuple[list[int], list[int]] = ([], [])
        for index in self.sampler:
            bucket = buckets[self.dataset.is_portrait(index)]
            bucket.append(index)
            if len(bucket) == self.batch_size:
                yield bucket[:]
                bucket.clear()
        if not self.drop_last:
            for bucket in buckets:
                if bucket:
                    yield bucket


def make_shapes_coco(root: str, num_train: int = 16, num_val: int = 8, image_size: int = 128,
                     seed: int = 0) -> dict[str, str]:
    """Write a small COCO-format instance segmentation set of drawn shapes under ``root``.

    Standard layout (``annotations/instances_{train,val}2017.json``, ``train2017/``,
    ``val2017/``); squares and triangles carry polygon masks, ellipses (and crowds) RLE masks, and every
    third training image a crowd region. Returns the annotation file of each split.
    """
    rng = np.random.default_rng(seed)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    files, ann_id = {}, 1
    for split, count in (('train2017', num_train), ('val2017', num_val)):
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, annotations = [], []
        for n in range(count):
            image_id = 1000 * (split == 'val2017') + n + 1
            image, anns = _draw_shapes(rng, image_size, crowd=split == 'train2017' and n % 3 == 0)
            name = f'{image_id:012d}.jpg'
            image.save(osp.join(root, split, name), quality=95)
            images.append({'id': image_id, 'file_name': name, 'width': image_size,
                           'height': image_size})
            for ann in anns:
                annotations.append(dict(ann, id=ann_id, image_id=image_id))
                ann_id += 1
        files[split] = osp.join(root, 'annotations', f'instances_{split}.json')
        write_json({'images': images, 'annotations': annotations,
                    'categories': list(SHAPE_CATEGORIES)}, files[split], indent=None)
    return files


def _draw_shapes(rng: np.random.Generator, size: int, crowd: bool) -> tuple[Image.Image, list[dict]]:
    """One image with a shape in some cells of a 2x2 grid, and its annotations."""
    noise = rng.integers(170, 230, (size, size, 3), dtype=np.uint8)
    image = Image.fromarray(noise)
    draw = ImageDraw.Draw(image)
    cell = size // 2
    anns = []
    cells = [(x, y) for x in (0, cell) for y in (0, cell)]
    for k, (cx, cy) in enumerate(cells):
        if k > 0 and rng.random() < 0.3:
            continue
        side = int(rng.integers(cell // 2, cell - 4))
        x0, y0 = cx + int(rng.integers(2, cell - side - 1)), cy + int(rng.integers(2, cell - side - 1))
        category = SHAPE_CATEGORIES[int(rng.integers(len(SHAPE_CATEGORIES)))]['id']
        colour = tuple(int(c) for c in rng.integers(0, 140, 3))
        mask_image = Image.new('L', (size, size), 0)
        mask_draw = ImageDraw.Draw(mask_image)
        if category == 7:
            box = [x0, y0, x0 + side, y0 + side * 0.7]
            draw.ellipse(box, fill=colour)
            mask_draw.ellipse(box, fill=1)
            segmentation = None
        else:
            points = ([(x0, y0), (x0 + side, y0), (x0 + side, y0 + side), (x0, y0 + side)]
                      if category == 1 else
                      [(x0 + side / 2, y0), (x0 + side, y0 + side), (x0, y0 + side)])
            draw.polygon(points, fill=colour)
            mask_draw.polygon(points, fill=1)
            segmentation = [[float(v) for p in points for v in p]]
        anns.append(_annotation(np.array(mask_image), category, segmentation, iscrowd=0))
    if crowd:  # a crowd region along the bottom edge: ignored in training and evaluation
        region = np.zeros((size, size), np.uint8)
        region[size - 6:, : size // 3] = 1
        anns.append(_annotation(region, SHAPE_CATEGORIES[0]['id'], None, iscrowd=1))
    return image, anns


def _annotation(mask: np.ndarray, category: int, polygon: list | None, iscrowd: int) -> dict:
    """A COCO annotation of a binary mask: the polygon if given, else its compressed RLE."""
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    segmentation = polygon if polygon is not None else {'counts': rle['counts'].decode('ascii'),
                                                        'size': list(mask.shape)}
    return {'category_id': category, 'segmentation': segmentation,
            'bbox': [float(v) for v in mask_util.toBbox(rle)], 'area': float(mask_util.area(rle)),
            'iscrowd': iscrowd}
