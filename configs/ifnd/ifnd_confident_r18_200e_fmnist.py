# IFND on Fashion-MNIST with its labels accepted by confidence, not by the epoch, and flagged
# where two clustering levels agree (configs/_base_/confident_labels.py).
_base_ = ['./ifnd_r18_200e_fmnist.py', '../_base_/confident_labels.py']

model = dict(agreement=_base_._confident_detector.agreement)
pseudo_label_hook = dict(_base_.pseudo_label_hook, acceptance=_base_._confident_acceptance,
                         temperature=_base_._confident_kappa_temperature)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
