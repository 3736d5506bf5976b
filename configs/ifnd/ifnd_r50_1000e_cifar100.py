# IFND on CIFAR-100 (SimCLR base): k-means with [100, 300, 1000] clusters every 20 epochs, linear
# acceptance 0 -> 100%, elimination loss, tau 0.5.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py', '../_base_/pseudo_labels.py',
          '../_base_/fn_detection.py']

model = dict(type='IFND')
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[100, 300, 1000], interval=20,
    pipeline=_base_.eval_pipeline)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
