"""One contrastive algorithm assembled from parts, its one negatives step, and its batch form, SimCLR.

:class:`ContrastiveAlgorithm` holds the encoder (backbone f, projection head g) and the
false-negative parts: a ``detector`` (``dict(type='PseudoLabels')`` for IFND, ``'SupportViews'``
for FNC, ``'GloFND'``, ``'GroundTruth'`` for the oracles; see ``false_negatives/``), a
``treatment`` of what it flags (``'elim'``, ``'attr'``) and a ``weighting`` of the negatives that
remain (``dict(type='debiased', tau_plus=...)``, ``dict(type='hard', tau_plus=..., beta=...)``).

A base only lays out its step: its anchors, each anchor's positive and its candidate negatives
(a :class:`NegativeBatch`), which :meth:`ContrastiveAlgorithm.negatives_loss` turns into the loss:
detector, treatment, weighting, detection counts. :class:`SimCLR` takes its candidates from the
batch's views, ``moco.py`` from a queue, ``mocov3.py`` from the keys of the batch, ``nnclr.py``
contrasts support-set neighbours with predictions. The named methods (IFND, SupCon, FNC, ...) are
presets of these parts (``presets.py``).
"""
from collections.abc import Callable

import torch
import torch.nn.functional as F
from mmengine.dist import get_dist_info
from mmengine.model import BaseModel

from ifnd.device import compile_options
from ifnd.dist import gather_no_grad, gather_with_grad
from ifnd.models.false_negatives import (DetectorNeeds, NegativeBatch, PseudoLabelBank,
                                         build_weighting, check_parts)
from ifnd.models.false_negatives.detector import false_negative_detection_counts
from ifnd.models.false_negatives.treatment import WEIGHTING_OPTIONS, contrast
from ifnd.models.losses import check_candidates
from ifnd.registry import MODELS
from ifnd.settings import check_logit_scale, check_temperature

# The key of a step's false-negative detection counts among its outputs (not a loss, not logged).
DETECTION_KEY = '_detection_counts'


class ContrastiveAlgorithm(BaseModel):
    """Backbone f, projection head g, and the detector, treatment and weighting of negatives."""

    uses_prototypes = False  # whether the loss needs cluster centroids and concentrations
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
            check_logit_scale(name, self.temperature, self.weighting.beta)
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
        # Whether the step counts its flagged false negatives: a weighting alone flags nothing (its
        # correction is in expectation), so it has nothing to count.
        self.records_detection = self.detector is not None or self.weighting is None
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

    @property
    def round_outputs(self) -> frozenset[str]:
        """What this model's parts read of each clustering round (PseudoLabelHook computes it):
        the detector's, and the prototypes (centroids, concentrations) of a prototype loss."""
        prototypes = frozenset({'labels', 'centroids', 'concentrations'}) if self.uses_prototypes \
            else frozenset()
        return self.needs.round_outputs | prototypes

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

    def two_view_batch(self, anchors: torch.Tensor, candidates: torch.Tensor,
                       positive_index: torch.Tensor, excluded: torch.Tensor, data_samples: dict,
                       support: torch.Tensor | None = None) -> NegativeBatch:
        """The layout of two views of the M local images ``anchors`` ``[2M, D]`` against
        ``candidates`` ``[2T, D]``, the two views of every process's images (view 1's T, then view
        2's): each anchor's positive column and the columns ``excluded`` ``[2M, 2T]`` that are no
        candidate of it; the other columns are its negatives."""
        num, device = anchors.shape[0] // 2, anchors.device
        rank, _ = get_dist_info()
        columns = torch.arange(candidates.shape[0], device=device)
        negatives = ~excluded & (columns.unsqueeze(0) != positive_index.unsqueeze(1))
        index = self._sample_index(data_samples, num, device)
        classes = self._classes(data_samples)
        return NegativeBatch(
            anchors=anchors, candidates=candidates, negatives=negatives,
            anchor_index=None if index is None else index.repeat(2),
            candidate_index=None if index is None else gather_no_grad(index).repeat(2),
            anchor_classes=None if classes is None else classes.repeat(2),
            candidate_classes=None if classes is None else gather_no_grad(classes).repeat(2),
            views=2, support=support, own_image=torch.arange(num, device=device) + rank * num,
            positive_index=positive_index, excluded=excluded)

    def cross_view_batch(self, anchors: torch.Tensor, candidates: torch.Tensor, data_samples: dict,
                         support: torch.Tensor | None = None) -> NegativeBatch:
        """The layout of ``anchors`` ``cat([a1, a2])`` (the M local images' two views) against the
        other view's ``candidates`` of every process ``cat([c1s, c2s])`` ``[2T, D]``: an anchor's
        positive is its image's candidate of the other view, its own view's candidates are none
        (MoCo v3's queries and keys, NNCLR's neighbours and predictions)."""
        num, device = anchors.shape[0] // 2, anchors.device
        rank, _ = get_dist_info()
        total = candidates.shape[0] // 2
        own = torch.arange(num, device=device) + rank * num
        positive_index = torch.cat([own + total, own])  # view 1 against view 2 and back
        view = torch.arange(2, device=device).repeat_interleave(num)
        column_view = torch.arange(2, device=device).repeat_interleave(total)
        excluded = view.unsqueeze(1) == column_view.unsqueeze(0)
        batch = self.two_view_batch(anchors, candidates, positive_index, excluded, data_samples, support)
        batch.negatives_per_anchor = total - 1
        return batch

    def negatives_loss(self, batch: NegativeBatch) -> dict:
        """The loss of a laid-out step: the detector flags, the treatment acts on the flags, the
        weighting weighs the rest, and the flags are counted against the classes where tracked."""
        if self.weighting is not None and batch.negatives_per_anchor is not None \
                and batch.negatives_per_anchor < 1:
            raise ValueError(f'{type(self).__name__} needs at least 2 images per batch (over all '
                             'processes) to have a negative; raise train_dataloader.batch_size')
        flags = None if self.detector is None else self.detector(batch)
        with torch.autocast(batch.anchors.device.type, enabled=False):  # logits / tau need float32
            loss = contrast(batch, flags, self.treatment, self.weighting, self.temperature,
                            detecting=self.detector is not None)
        logged = {} if self.detector is None else self.detector.log_vars(batch)
        return {'loss': loss, **logged, **self._detection_counts(flags, batch)}

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

    def negative_batch(self, z1: torch.Tensor, z2: torch.Tensor, data_samples: dict,
                       support: torch.Tensor | None = None) -> NegativeBatch:
        """The layout: the 2M local views ``cat([z1, z2])`` against the views of all ranks
        ``cat([z1s, z2s])`` (with gradients); each anchor's positive is its image's other view, its
        own column is no candidate."""
        num = z1.shape[0]
        rank, world_size = get_dist_info()
        total = num * world_size
        # The candidates' graph first: the order gradients add up in, bit for bit as before.
        candidates = torch.cat([gather_with_grad(z1), gather_with_grad(z2)])
        anchors = torch.cat([z1, z2])
        own = torch.arange(num, device=z1.device) + rank * num
        positive_index, self_index = torch.cat([own + total, own]), torch.cat([own, own + total])
        check_candidates(anchors, candidates, positive_index, self_index, self.temperature)
        columns = torch.arange(candidates.shape[0], device=z1.device)
        excluded = columns.unsqueeze(0) == self_index.unsqueeze(1)
        batch = self.two_view_batch(anchors, candidates, positive_index, excluded, data_samples, support)
        batch.negatives_per_anchor = candidates.shape[0] - 2
        return batch

    def batch_losses(self, z1: torch.Tensor, z2: torch.Tensor, data_samples: dict,
                     support: torch.Tensor | None = None) -> dict:
        """The contrastive loss of the 2M local views against the views of all ranks."""
        return self.negatives_loss(self.negative_batch(z1, z2, data_samples, support))

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
