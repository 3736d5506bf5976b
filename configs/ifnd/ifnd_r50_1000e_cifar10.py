# IFND on CIFAR-10 (SimCLR base): k-means with [10, 30, 100] clusters every 20 epochs, linear
# acceptance 0 -> 100%, elimination loss, tau 0.5.
_base_ = ['../simclr/simclr_r50_1000e_cifar10.py', '../_base_/pseudo_labels.py',
          '../_base_/fn_detection.py']

model = dict(type='IFND')
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[10, 30, 100], interval=20,
    pipeline=_base_.eval_pipeline)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
