"""Contrastive losses with pseudo-label aware false-negative handling: the equations the models run.

One masked InfoNCE (:func:`masked_nce`) covers the three objectives of IFND (Chen et al., ICLR
2022), by the treatment of the flagged false negatives:

* ``None`` -- instance discrimination, Eq. ``eq:contrastive``: the positive of anchor ``i`` is
  its other view ``i'``, every other candidate is a negative.
* ``'elim'`` -- false-negative elimination, Eq. ``eq:elimination``: flagged candidates (those that
  share the anchor's pseudo label, other than ``i'``) leave the denominator.
* ``'attr'`` -- false-negative attraction, Eq. ``eq:attraction`` (SupCon's form): flagged
  candidates join the positives; the denominator keeps every candidate.

Pseudo labels come as ``[L, M]`` (``L`` clustering granularities); the loss is the average over
levels. Samples whose pseudo label was not accepted must carry labels that match no other sample
(e.g. ``-(index + 1)``), which makes them pure instance-discrimination samples.
:func:`contrastive_loss` is the batch form of one process (SimCLR's 2M views); the models build
their logits with :func:`candidate_logits` (SimCLR, over the gathered views) or
:func:`queue_logits` (MoCo) and join detectors and treatments in
:mod:`ifnd.models.false_negatives.treatment`.

``proto_nce_loss`` is the prototype term of PCL's ProtoNCE, used by the PCL baselines.

Other ways of handling false negatives, compared with IFND:

* ``debiased_nce`` -- the debiased contrastive loss (Chuang et al., NeurIPS 2020), and with
  β > 0 hard negative sampling (Robinson et al., ICLR 2021); on MoCo's queue
  ``queue_debiased_loss``.

Files: ``nce.py`` (the masked InfoNCE and its logits), ``debiased.py`` (debiased and hard
negatives), ``prototypes.py`` (ProtoNCE's prototype term). The detectors' own arithmetic lives
with them (FNC's selection from support views in
``false_negatives/support_views.py``, the detection counts in ``false_negatives/detector.py``).
"""
from .debiased import check_debiasing, debiased_nce, queue_debiased_loss
from .nce import (TREATMENTS, batch_views, candidate_logits, check_candidates, check_treatment,
                  contrastive_loss, masked_nce, queue_logits)
from .prototypes import proto_nce_loss

__all__ = [
    'TREATMENTS', 'check_treatment', 'masked_nce', 'check_candidates', 'candidate_logits',
    'batch_views', 'contrastive_loss', 'queue_logits', 'check_debiasing', 'debiased_nce',
    'queue_debiased_loss', 'proto_nce_loss',
]
