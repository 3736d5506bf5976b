# The elimination oracle on IFND's schedule with ViT-Tiny (4-pixel patches): ground-truth classes,
# accepted for a random share r = epoch / max_epochs of the images, updated at IFND's clustering
# interval (as oracle_elim_linear_r18_200e_fmnist.py).
_base_ = ['./ifnd_vit-tiny-p4_200e_fmnist.py']

model = dict(type='SimCLR', treatment='elim', detector=dict(
    type='GroundTruth', acceptance=dict(type='LinearAcceptance', final_rate=1.0,
                                        interval=_base_.pseudo_label_hook.interval, seed=0)))
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
