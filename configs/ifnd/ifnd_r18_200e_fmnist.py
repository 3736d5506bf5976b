# IFND on Fashion-MNIST (SimCLR base, ResNet-18): k-means with [10, 30, 100] clusters every
# 5 epochs, linear acceptance 0 -> 100%, elimination loss.
_base_ = ['../simclr/simclr_r18_200e_fmnist.py']

model = dict(type='IFND', loss_mode='elim')
pseudo_label_hook = dict(
    type='PseudoLabelHook',
    num_clusters=[10, 30, 100],
    interval=5,
    scheme='linear',
    final_rate=1.0,
    feature='z',
    confidence='kappa',
    pipeline={{_base_.eval_pipeline}},
    kmeans=dict(niter=20, nredo=5, max_points_per_centroid=1000, min_points_per_centroid=10),
)
custom_hooks = [pseudo_label_hook, {{_base_.knn_hook}}]
