# IFND on Fashion-MNIST (SimCLR base, ViT-Tiny with 4-pixel patches): k-means with [10, 30, 100]
# clusters every 5 epochs, linear acceptance 0 -> 100%, elimination loss.
_base_ = ['../simclr/simclr_vit-tiny-p4_200e_fmnist.py', '../_base_/pseudo_labels.py',
          '../_base_/fn_detection.py']

model = dict(type='IFND')  # elimination (Eq. 3), the preset's treatment
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[10, 30, 100], interval=5,
    pipeline=_base_.eval_pipeline)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
