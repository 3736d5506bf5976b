"""Running the COCO transfer with detectron2 (the papers' protocol, MoCo's detection code path):
the backbone exported, the config translated, then detectron2's ``DefaultTrainer`` under its
``launch``.

detectron2 is imported inside the functions that use it: ``require_detectron2()`` says how to
install it when it is missing.
"""
from __future__ import annotations

import argparse
import importlib.util
import os.path as osp
from types import ModuleType

from mmengine.config import Config

from ifnd.evaluation.coco import RESULTS_FILE
from ifnd.fileio import write_json
from ifnd.transfer.detectron2_config import (EXTRA_NORM_HEAD, config_dict, dataset_registrations,
                                             detectron2_options, write_detectron2_config)
from ifnd.transfer.detectron2_weights import export_detectron2_weights

DETECTRON2_MISSING = (
    'detectron2 is not installed. It is not on PyPI (the look-alike packages there are broken '
    'repackagings); install it from its source repository, which needs a C++/CUDA compiler and '
    'builds against the torch already installed here (hence no build isolation):\n'
    '    pip install --no-build-isolation '
    "'git+https://github.com/facebookresearch/detectron2.git'\n"
    'or clone it and run `pip install --no-build-isolation -e .` in the clone. '
    'Without detectron2, run the COCO transfer with --engine torchvision.')

WEIGHTS_FILE = 'backbone_detectron2.pkl'
CONFIG_FILE = 'detectron2_config.yaml'


def detectron2_available() -> bool:
    """Whether detectron2 can be imported."""
    try:
        return importlib.util.find_spec('detectron2') is not None
    except (ImportError, ValueError):
        return False


def require_detectron2() -> ModuleType:
    """The detectron2 module, or an ImportError that says how to install it."""
    try:
        import detectron2
    except ImportError as err:
        raise ImportError(DETECTRON2_MISSING) from err
    return detectron2


def register_extra_norm_head() -> type:
    """Register (once) the C4 RoI head with one more norm layer after res5, MoCo's choice."""
    require_detectron2()
    from detectron2.layers import get_norm
    from detectron2.modeling import ROI_HEADS_REGISTRY
    from detectron2.modeling.roi_heads import Res5ROIHeads

    if EXTRA_NORM_HEAD in ROI_HEADS_REGISTRY:
        head = ROI_HEADS_REGISTRY.get(EXTRA_NORM_HEAD)
        if not getattr(head, '_ifnd_extra_norm', False):
            raise RuntimeError(f'another {EXTRA_NORM_HEAD} is registered in detectron2')
        return head

    class Res5ROIHeadsExtraNorm(Res5ROIHeads):
        """Res5ROIHeads whose res5 ends in a norm layer (``MODEL.RESNETS.NORM``)."""

        _ifnd_extra_norm = True

        @classmethod
        def _build_res5_block(cls, cfg):
            res5, out_channels = super()._build_res5_block(cfg)
            # The same name as in the torchvision engine's res5 (res5.norm).
            res5.add_module('norm', get_norm(cfg.MODEL.RESNETS.NORM, out_channels))
            return res5, out_channels

    ROI_HEADS_REGISTRY.register(Res5ROIHeadsExtraNorm)
    return Res5ROIHeadsExtraNorm


def build_detectron2_config(options: dict[str, object]):
    """A frozen detectron2 ``CfgNode``: its defaults with the options set."""
    require_detectron2()
    from detectron2.config import get_cfg

    cfg = get_cfg()
    for key, value in options.items():
        *parents, leaf = key.split('.')
        node = cfg
        for part in parents:
            node = getattr(node, part)
        if leaf not in node:
            raise KeyError(f'this detectron2 has no config key {key}; update detectron2')
        setattr(node, leaf, value)
    cfg.freeze()
    return cfg


def _trainer_class(max_to_keep: int | None):
    """detectron2's DefaultTrainer with COCO evaluation, kept results and checkpoint retention."""
    from detectron2.engine import DefaultTrainer, hooks
    from detectron2.evaluation import COCOEvaluator

    class Trainer(DefaultTrainer):
        last_results = None

        @classmethod
        def build_evaluator(cls, cfg, dataset_name, output_folder=None):
            return COCOEvaluator(dataset_name, output_dir=output_folder or osp.join(
                cfg.OUTPUT_DIR, 'inference'))

        @classmethod
        def test(cls, cfg, model, evaluators=None):
            # Kept for the results file: DefaultTrainer.train returns them only when checking
            # expected results.
            cls.last_results = super().test(cfg, model, evaluators)
            return cls.last_results

        def build_hooks(self):
            built = super().build_hooks()
            for hook in built:
                if isinstance(hook, hooks.PeriodicCheckpointer):
                    hook.max_to_keep = max_to_keep  # default_hooks.checkpoint.max_keep_ckpts
            return built

    return Trainer


def _register_datasets(registrations: list[tuple[str, str, str]]) -> None:
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    for name, json_file, image_root in registrations:
        if name in DatasetCatalog.list():  # a second run in the same process
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        register_coco_instances(name, {}, json_file, image_root)


def _detectron2_worker(job: dict) -> None:
    """One process of the run (started by detectron2's ``launch``)."""
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.engine import default_setup
    from detectron2.utils import comm

    register_extra_norm_head()
    _register_datasets(job['registrations'])
    cfg = build_detectron2_config(job['options'])
    default_setup(cfg, argparse.Namespace(config_file=job['config_file'],
                                          eval_only=job['eval_only'], resume=job['resume']))
    Trainer = _trainer_class(job['max_to_keep'])
    if job['eval_only']:
        model = Trainer.build_model(cfg)
        checkpointer = DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR)
        if job['detector_weights']:
            checkpointer.resume_or_load(job['detector_weights'], resume=False)
        else:  # the work dir's last checkpoint (run_detectron2 checked it is there)
            checkpointer.resume_or_load(cfg.MODEL.WEIGHTS, resume=True)
        results = Trainer.test(cfg, model)
    else:
        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=job['resume'])
        trainer.train()
        results = Trainer.last_results
        if results is None:
            results = Trainer.test(cfg, trainer.model)
    if comm.is_main_process():
        write_json(_plain_results(results), osp.join(cfg.OUTPUT_DIR, RESULTS_FILE),
                   announce=True)


def _plain_results(results) -> dict:
    """COCOEvaluator's nested OrderedDicts (already in percent) as plain dicts of floats."""
    return {task: {name: float(value) for name, value in metrics.items()}
            for task, metrics in results.items()}


def run_detectron2(cfg: Config, checkpoint: str | None, work_dir: str, *, data_root: str | None,
                   model_name: str | None, num_gpus: int, num_machines: int, machine_rank: int,
                   dist_url: str, resume: bool, eval_only: bool, detector_weights: str | None,
                   amp: bool) -> None:
    """Fine-tune (or evaluate) Mask R-CNN with detectron2; write ``work_dir/coco_results.json``.

    The checkpoint's backbone is exported to ``work_dir/backbone_detectron2.pkl`` and starts the
    detector, unless ``load_from`` in the config names a detectron2 detector checkpoint.
    """
    require_detectron2()
    from detectron2.engine import launch

    plain = config_dict(cfg)
    registrations = dataset_registrations(plain, data_root, include_train=not eval_only)
    if eval_only:
        # detectron2's checkpointer records its latest file in last_checkpoint.
        detector = detector_weights or osp.join(work_dir, 'last_checkpoint')
        if '://' not in detector and not osp.isfile(detector):
            raise FileNotFoundError(f'No detector checkpoint to evaluate: {detector} (pass '
                                    '--detector PATH, or train first)')
    weights, depth = plain.get('load_from') or '', None
    if checkpoint is not None and not weights:
        exported = export_detectron2_weights(checkpoint, osp.join(work_dir, WEIGHTS_FILE),
                                             model_name=model_name,
                                             default_backbone=plain['model'].get('backbone'))
        weights, depth = exported['out'], exported['depth']
        print(f"Backbone {exported['model_name']} (ResNet-{depth}) exported to {weights}")
    elif not weights and not eval_only:
        raise ValueError('no pre-trained checkpoint to start the detector from')
    if osp.exists(weights):
        weights = osp.abspath(weights)  # detectron2 also takes URLs, left as they are
    options = detectron2_options(plain, weights, work_dir, num_gpus * num_machines, amp=amp,
                                 depth=depth)
    config_file = osp.join(work_dir, CONFIG_FILE)
    write_detectron2_config(options, config_file)
    checkpoint_hook = (plain.get('default_hooks') or {}).get('checkpoint') or {}
    max_keep = checkpoint_hook.get('max_keep_ckpts', -1)
    job = {'options': options, 'registrations': registrations, 'config_file': config_file,
           'eval_only': eval_only, 'resume': resume, 'detector_weights': detector_weights,
           'max_to_keep': max_keep if max_keep and max_keep > 0 else None}
    launch(_detectron2_worker, num_gpus, num_machines=num_machines, machine_rank=machine_rank,
           dist_url=dist_url, args=(job,))
