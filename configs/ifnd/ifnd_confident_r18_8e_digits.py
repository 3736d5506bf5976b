# IFND on digits with its labels accepted by confidence, not by the epoch, and flagged where two
# clustering levels agree (configs/_base_/confident_labels.py). κ's bound 0.3 of the way from
# chance to certainty was chosen on the digits protocol's validation split (0.5 accepted almost
# nothing in its 8 epochs; docs/false_negatives.md).
_base_ = ['./ifnd_r18_8e_digits.py', '../_base_/confident_labels.py']

model = dict(type='SimCLR', detector=_base_._confident_detector, treatment='elim')
pseudo_label_hook = dict(_base_.pseudo_label_hook, **dict(_base_._confident_acceptance, threshold=0.3))
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
