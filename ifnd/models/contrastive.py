"""One contrastive algorithm assembled from parts, and its batch form, SimCLR.

:class:`ContrastiveAlgorithm` holds the encoder (backbone f, projection head g) and the
false-negative parts: a ``detector`` (``dict(type='PseudoLabels')`` for IFND, ``'SupportViews'``
for FNC, ``'GloFND'``, ``'GroundTruth'`` for the oracles; see ``false_negatives/``), a
``treatment`` of what it flags (``'elim'``, ``'attr'``) and a ``weighting`` of the negatives that
remain (``dict(type='debiased', tau_plus=...)``, ``dict(type='hard', tau_plus=..., beta=...)``).
:class:`SimCLR` takes its negatives from the batch's views; ``moco.py`` from a queue. The named
methods (IFND, SupCon, FNC, ...) are presets of these parts (``presets.py``).
"""
from collections.abc import Callable

import torch
import torch.nn.functional as F
from mmengine.dist import get_dist_info
from mmengine.model import BaseModel

from ifnd.device import compile_options
from ifnd.dist import gather_no_grad, gather_with_grad
from ifnd.models.false_negatives import (DetectorNeeds, NegativeBatch, PseudoLabelBank,
                                         build_weighting, check_parts, flagged_loss)
from ifnd.settings import check_logit_scale, check_temperature
from ifnd.models.false_negatives.treatment import WEIGHTING_OPTIONS
from ifnd.models.false_negatives.detector import false_negative_detection_counts
from ifnd.models.losses import candidate_logits, check_candidates
from ifnd.registry import MODELS

# The key of a step's false-negative detection counts among its outputs (not a loss, not logged).
DETECTION_KEY = '_detection_counts'


class ContrastiveAlgorithm(BaseModel):
    """Backbone f, projection head g, and the detector, treatment and weighting of negatives."""

    uses_prototypes = False  # whether the loss needs cluster centroids and concentrations
    records_detection = False  # whether the loss step counts its flagged false negatives
    # The keys a config may set inside dict-valued arguments, with their types: read by the config
    # checks of tools/train.py (``--cfg-options model.weighting.beta=2.0``).
    config_dict_options = {'weighting': WEIGHTING_OPTIONS}

    def __init__(self, backbone: dict, neck: dict, temperature: float,
                 detector: dict | None = None, treatment: str | None = None,
                 weighting: dict | None = None, data_preprocessor: dict | None = None,
                 init_cfg: dict | None = None) -> None:
        # Built here, in this scope, so the model also builds without init_default_scope('ifnd').
        data_preprocessor = MODELS.build(data_preprocessor or dict(type='ContrastiveDataPreprocessor'))
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        check_parts(detector, treatment, weighting)
        name = type(self).__name__
        self.temperature = check_temperature(name, temperature)
        self.weighting = build_weighting(weighting, name)
        if self.weighting is not None:
            check_logit_scale(name, self.temperature, self.weighting['beta'])
        self.treatment = treatment
        self.backbone = MODELS.build(backbone)
        neck = dict(neck)
        neck.setdefault('in_dim', self.backbone.out_dim)
        self.neck = MODELS.build(neck)
        self.detector = None if detector is None else MODELS.build(detector)
        # What the detector needs from this algorithm and the data, asked here and by the hooks.
        self.needs = DetectorNeeds() if self.detector is None else self.detector.needs
        if self.needs.label_bank or self.uses_prototypes:
            self.label_bank = PseudoLabelBank()
        if self.needs.label_bank:
            self.detector.attach(self.label_bank)
        # Counts [levels, 3] of the negatives the loss flags, summed on the device while
        # FalseNegativeDetectionHook sets ``track_detection``. A plain attribute, not a buffer:
        # DDP would overwrite every rank's counts with rank 0's at each forward.
        self.track_detection = False
        self.detection_counts: torch.Tensor | None = None

    @classmethod
    def configured_detector(cls, settings: dict) -> str | None:
        """The type of the detector a model built from the config ``settings`` holds (None: none),
        read without building it (the config checks ask what it needs)."""
        detector = settings.get('detector')
        return detector.get('type') if isinstance(detector, dict) else None

    def extract_feat(self, inputs: torch.Tensor) -> torch.Tensor:
        """Backbone features f(x)."""
        return self.backbone(inputs)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """L2-normalised embeddings z = g(f) of backbone features f, in float32 also under autocast."""
        return F.normalize(self.neck(features).float(), dim=1)

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """L2-normalised embeddings z = g(f(x)), in float32 also under autocast."""
        return self.project(self.backbone(inputs))

    def compiled(self, method: str, device: torch.device) -> Callable:
        """This model's method ``method``, compiled on ``device`` where the backbone's ``compile``
        setting compiles (``'auto'``: on CUDA), else as it is.

        The training step runs its projection head and loss through it: with the encoder compiled,
        they are one compiled region (static shapes) rather than a hundred eager kernels.
        """
        cache = self.__dict__.setdefault('_compiled', {})
        key = (method, str(device))
        if key not in cache:
            options = self._compile_options(device)
            fn = getattr(self, method)
            cache[key] = fn if options is None else torch.compile(fn, **options)
        return cache[key]

    def compiles(self, device: torch.device) -> bool:
        """Whether :meth:`compiled` compiles on ``device``."""
        return self._compile_options(device) is not None

    def _compile_options(self, device: torch.device) -> dict | None:
        return compile_options(getattr(self.backbone, 'compile_setting', False), device)

    def __getstate__(self) -> dict:
        """The module's state without its compiled methods: a copy compiles its own."""
        state = dict(super().__getstate__())
        state.pop('_compiled', None)
        return state

    @torch.no_grad()
    def clustering_features(self, inputs: torch.Tensor, feature: str = 'z') -> torch.Tensor:
        """Features used for clustering: normalised embeddings z or backbone features f."""
        if feature == 'z':
            return self.embed(inputs)
        if feature == 'f':
            return F.normalize(self.extract_feat(inputs).float(), dim=1)
        raise ValueError(f"feature must be 'z' or 'f', got {feature!r}")

    def forward(self, inputs, data_samples: dict | None = None, mode: str = 'tensor'):
        """mmengine entry point: 'loss' for training, 'tensor'/'predict' for features."""
        if mode == 'loss':
            return self.loss(inputs, data_samples or {})
        views = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        if mode == 'tensor':
            return self.extract_feat(views)
        if mode == 'predict':
            return self.clustering_features(views, 'f')
        raise ValueError(f"mode must be 'loss', 'tensor' or 'predict', got {mode!r}")

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """Loss dict for a batch of views."""
        raise NotImplementedError

    def _check_views(self, inputs: list[torch.Tensor]) -> None:
        support = self.needs.support_views
        if support and len(inputs) != 2 + support:
            raise ValueError(f'{type(self.detector).__name__} with num_support_views={support} '
                             f'needs {2 + support} views per image (2 + S), the pipeline gave '
                             f'{len(inputs)}: set num_views={2 + support} in the MultiView of '
                             'train_dataloader.dataset.pipeline (or num_support_views to match)')
        if len(inputs) < 2:
            raise ValueError(f'{type(self).__name__} needs two views per image; the pipeline gave '
                             f'{len(inputs)}: use MultiView(num_views=2)')

    def _sample_index(self, data_samples: dict, num: int, device: torch.device) -> torch.Tensor | None:
        """The batch's sample indices; required by detectors with per-sample state."""
        index = data_samples.get('index')
        if index is None and self.needs.sample_index:
            raise ValueError(f"{type(self.detector).__name__} keeps per-sample state and needs "
                             "data_samples['index'] (the data sets of ifnd give it)")
        return None if index is None else index.to(device)

    def _classes(self, data_samples: dict) -> torch.Tensor | None:
        classes = data_samples.get('label')
        if classes is None and self.needs.classes:
            raise ValueError('the GroundTruth detector (SupCon, OracleElim) needs a data set with '
                             'labels: every training image needs its class')
        return classes

    def _detection_counts(self, flags: torch.Tensor | None, batch: NegativeBatch) -> dict:
        """The batch's detection counts (ground truth: its classes) under ``DETECTION_KEY`` when
        tracked: a step's output, added up outside the (compiled) loss by :meth:`_add_detection`."""
        if not self.track_detection or batch.anchor_classes is None:
            return {}
        levels = 1 if self.detector is None else self.detector.levels
        return {DETECTION_KEY: false_negative_detection_counts(
            flags, batch.negatives, batch.anchor_classes, batch.candidate_classes, levels)}

    def _add_detection(self, losses: dict) -> dict:
        """The step's losses, its detection counts (if any) moved from them into the running sum."""
        counts = losses.pop(DETECTION_KEY, None)
        if counts is None:
            return losses
        held = self.detection_counts
        if held is None or held.shape != counts.shape or held.device != counts.device:
            self.detection_counts = counts
        else:
            held += counts
        return losses


@MODELS.register_module()
class SimCLR(ContrastiveAlgorithm):
    """The batch form: 2M views per batch, every other view a candidate, gathered across ranks."""

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.1, **kwargs) -> None:
        super().__init__(backbone, neck, temperature, **kwargs)
        # A weighting alone flags nothing (its correction is in expectation): nothing to count.
        self.records_detection = self.detector is not None or self.weighting is None

    def embed_views(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings of the two views, encoded as one batch of 2M (BN sees both views)."""
        self._check_views(inputs)
        z1, z2 = self.embed(torch.cat(inputs[:2])).chunk(2)
        return z1, z2

    def head_losses(self, features: torch.Tensor, data_samples: dict) -> dict:
        """The losses of the two views' backbone features ``[2M, F]``: projected, normalised and
        contrasted (:meth:`batch_losses`)."""
        z1, z2 = self.project(features).chunk(2)
        return self.batch_losses(z1, z2, data_samples)

    @torch.no_grad()
    def support_embeddings(self, inputs: list[torch.Tensor], num: int) -> torch.Tensor | None:
        """Support views ``[M, S, D]`` (FNC): no gradient, one forward of their own."""
        support = self.needs.support_views
        if not support:
            return None
        # Their BN statistics are their own batch's, as a separate crop group.
        return self.embed(torch.cat(inputs[2:])).view(support, num, -1).transpose(0, 1)

    def gathered_views(self, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Local anchors ``cat([z1, z2])``, the views of all ranks ``cat([z1s, z2s])`` (with
        gradients), and each anchor's positive and own row among them."""
        num = z1.shape[0]
        rank, world_size = get_dist_info()
        total = num * world_size
        candidates = torch.cat([gather_with_grad(z1), gather_with_grad(z2)])
        own = torch.arange(num, device=z1.device) + rank * num
        return (torch.cat([z1, z2]), candidates, torch.cat([own + total, own]),
                torch.cat([own, own + total]))

    def negative_batch(self, z1: torch.Tensor, z2: torch.Tensor, data_samples: dict,
                       support: torch.Tensor | None = None) -> tuple[NegativeBatch, torch.Tensor,
                                                                     torch.Tensor]:
        """The detectors' view of the batch, and each anchor's positive and own column."""
        anchors, candidates, positive_index, self_index = self.gathered_views(z1, z2)
        num, device = z1.shape[0], z1.device
        columns = torch.arange(candidates.shape[0], device=device).unsqueeze(0)
        negatives = (columns != positive_index.unsqueeze(1)) & (columns != self_index.unsqueeze(1))
        index = self._sample_index(data_samples, num, device)
        classes = self._classes(data_samples)
        rank, _ = get_dist_info()
        batch = NegativeBatch(
            anchors=anchors, candidates=candidates, negatives=negatives,
            anchor_index=None if index is None else index.repeat(2),
            candidate_index=None if index is None else gather_no_grad(index).repeat(2),
            anchor_classes=None if classes is None else classes.repeat(2),
            candidate_classes=None if classes is None else gather_no_grad(classes).repeat(2),
            views=2, support=support, own_image=torch.arange(num, device=device) + rank * num)
        return batch, positive_index, self_index

    def batch_losses(self, z1: torch.Tensor, z2: torch.Tensor, data_samples: dict,
                     support: torch.Tensor | None = None) -> dict:
        """The contrastive loss of the 2M local views against the views of all ranks."""
        batch, positive_index, self_index = self.negative_batch(z1, z2, data_samples, support)
        anchors, candidates = batch.anchors, batch.candidates
        if self.weighting is not None and candidates.shape[0] < 3:
            raise ValueError(f'{type(self).__name__} needs at least 2 images per batch (over all '
                             'processes) to have a negative; raise train_dataloader.batch_size')
        flags = None if self.detector is None else self.detector(batch)
        check_candidates(anchors, candidates, positive_index, self_index, self.temperature)
        with torch.autocast(z1.device.type, enabled=False):  # logits / tau need float32
            logits, excluded, positive_index = candidate_logits(
                anchors, candidates, positive_index, self_index, self.temperature)
            per_anchor = flagged_loss(logits, positive_index, excluded, flags, self.treatment,
                                      self.weighting, self.temperature)
        logged = {} if self.detector is None else self.detector.log_vars(batch)
        return {'loss': per_anchor.mean(), **logged, **self._detection_counts(flags, batch)}

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """The contrastive loss of a batch, with its detector's flags treated."""
        self._check_views(inputs)
        features = self.backbone(torch.cat(inputs[:2]))  # one batch of 2M: BN sees both views
        if self.needs.support_views:  # embedded after the views, whose BN statistics come first
            z1, z2 = self.project(features).chunk(2)
            support = self.support_embeddings(inputs, z1.shape[0])
            losses = self.compiled('batch_losses', features.device)(z1, z2, data_samples, support)
        else:
            losses = self.compiled('head_losses', features.device)(features, data_samples)
        return self._add_detection(losses)
