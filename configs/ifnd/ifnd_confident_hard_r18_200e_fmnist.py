# IFND with confident labels (./ifnd_confident_r18_200e_fmnist.py) and hard negative weighting of the
# negatives it keeps: evidence-accepted detection beside the best label-free weighting. A preset
# fixes its weighting, so this combination is written with the SimCLR base's parts.
_base_ = ['./ifnd_r18_200e_fmnist.py', '../_base_/confident_labels.py', '../_base_/hard_negatives.py']

model = dict(type='SimCLR', detector=_base_._confident_detector, treatment='elim',
             weighting=_base_._hard_weighting)
pseudo_label_hook = dict(_base_.pseudo_label_hook, acceptance=_base_._confident_acceptance,
                         temperature=_base_._confident_kappa_temperature)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
