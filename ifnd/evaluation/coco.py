"""COCO detection and instance segmentation evaluation with pycocotools' COCOeval."""
from __future__ import annotations

import contextlib
import io
import os.path as osp

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.logging import print_log
from pycocotools import mask as mask_util
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from ifnd.fileio import write_json
from ifnd.registry import METRICS

# Written to the work dir by both engines (detections by the torchvision engine only).
RESULTS_FILE = 'coco_results.json'
DETECTIONS_FILE = 'coco_detections.json'
# COCOeval.stats in order, as detectron2 names them.
STAT_NAMES = ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl',
              'AR1', 'AR10', 'AR100', 'ARs', 'ARm', 'ARl')
# The paper's Table 5 columns: (iou type, stat, header).
TABLE_COLUMNS = (('bbox', 'AP', 'AP^bb'), ('bbox', 'AP50', 'AP^bb_50'), ('bbox', 'AP75', 'AP^bb_75'),
                 ('segm', 'AP', 'AP^mk'), ('segm', 'AP50', 'AP^mk_50'), ('segm', 'AP75', 'AP^mk_75'))


def detections_to_coco(detection: dict, cat_ids: list[int]) -> list[dict]:
    """COCO result records (XYWH boxes, RLE masks) of one image's detections with labels 1..K."""
    boxes = detection['boxes'].detach().float().cpu().numpy()
    scores = detection['scores'].detach().float().cpu().numpy()
    labels = detection['labels'].detach().cpu().numpy()
    masks = detection.get('masks')
    rles = []
    if masks is not None and len(masks):
        masks = masks.detach().cpu().numpy().astype(np.uint8)
        rles = mask_util.encode(np.asfortranarray(masks.transpose(1, 2, 0)))
    records = []
    for i, (box, score, label) in enumerate(zip(boxes, scores, labels)):
        record = {'image_id': int(detection['image_id']), 'category_id': cat_ids[int(label) - 1],
                  'bbox': [float(box[0]), float(box[1]), float(box[2] - box[0]), float(box[3] - box[1])],
                  'score': float(score)}
        if len(rles):
            record['segmentation'] = {'size': [int(s) for s in rles[i]['size']],
                                      'counts': rles[i]['counts'].decode('ascii')}
        records.append(record)
    return records


def evaluate_coco(coco_gt: COCO, results: list[dict],
                  iou_types: tuple[str, ...] = ('bbox', 'segm')) -> dict[str, dict[str, float]]:
    """COCOeval's twelve statistics per IoU type in percent (NaN where undefined); prints its summary."""
    if not results:
        print_log('No detections to evaluate: every AP is 0', logger='current', level=30)
        return {t: {name: 0.0 for name in STAT_NAMES} for t in iou_types}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' loading chatter
        coco_dt = coco_gt.loadRes(results)
    metrics = {}
    for iou_type in iou_types:
        evaluator = COCOeval(coco_gt, coco_dt, iou_type)
        with contextlib.redirect_stdout(io.StringIO()):
            evaluator.evaluate()
            evaluator.accumulate()
        print(f'COCOeval summary ({iou_type}):')
        evaluator.summarize()
        # COCOeval's -1 marks a statistic without ground truth (e.g. no large objects).
        metrics[iou_type] = {name: float(100 * s) if s >= 0 else float('nan')
                             for name, s in zip(STAT_NAMES, evaluator.stats)}
    return metrics


def format_results_table(results: dict[str, dict[str, float]], title: str = '') -> str:
    """The paper's Table 5 row (bbox and mask AP, AP50, AP75) as a Markdown table."""
    columns = [(t, s, h) for t, s, h in TABLE_COLUMNS if t in results]
    header = ['Pre-train'] + [h for _, _, h in columns]
    row = [title or '-'] + [f'{results[t][s]:.1f}' for t, s, _ in columns]
    widths = [max(len(a), len(b)) for a, b in zip(header, row)]
    lines = ['| ' + ' | '.join(c.rjust(w) for c, w in zip(cells, widths)) + ' |'
             for cells in (header, row)]
    lines.insert(1, '|' + '|'.join('-' * (w + 2) for w in widths) + '|')
    return '\n'.join(lines)


@METRICS.register_module()
class CocoMetric(BaseMetric):
    """bbox and mask AP on a COCO-format annotation file, through pycocotools' COCOeval.

    Writes the detections (``coco_detections.json``) and the statistics (``coco_results.json``)
    to ``output_dir`` when it is set, and logs the paper's table.
    """

    default_prefix = 'coco'

    def __init__(self, data_root: str, ann_file: str, iou_types: tuple[str, ...] = ('bbox', 'segm'),
                 output_dir: str | None = None, title: str = '', collect_device: str = 'cpu',
                 prefix: str | None = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.ann_path = osp.join(data_root, ann_file)
        if not osp.isfile(self.ann_path):
            raise FileNotFoundError(f'COCO annotation file not found: {self.ann_path}; pass '
                                    '--data-root DIR or set val_evaluator.ann_file')
        unknown = set(iou_types) - {'bbox', 'segm'}
        if unknown:
            raise ValueError(f"iou_types must be among ('bbox', 'segm'), got {sorted(unknown)}")
        self.iou_types = tuple(iou_types)
        self.output_dir = output_dir
        self.title = title
        with contextlib.redirect_stdout(io.StringIO()):
            self.coco_gt = COCO(self.ann_path)
        self.cat_ids = sorted(self.coco_gt.getCatIds())

    def process(self, data_batch, data_samples: list[dict]) -> None:
        """Keep one batch's detections as COCO records (RLE masks, so little memory)."""
        with torch.no_grad():
            for detection in data_samples:
                self.results.extend(detections_to_coco(detection, self.cat_ids))

    def compute_metrics(self, results: list) -> dict[str, float]:
        """COCOeval on all detections; ``{iou_type}_{stat}`` in percent."""
        stats = evaluate_coco(self.coco_gt, results, self.iou_types)
        print_log('\n' + format_results_table(stats, self.title), logger='current')
        if self.output_dir:
            write_json(results, osp.join(self.output_dir, DETECTIONS_FILE), indent=None,
                       announce=True)
            write_json(stats, osp.join(self.output_dir, RESULTS_FILE), announce=True)
        return {f'{t}_{name}': value for t, values in stats.items() for name, value in values.items()}
