# IFND on CIFAR-100 (SimCLR base): k-means with [100, 300, 1000] clusters every 20 epochs, linear
# acceptance 0 -> 100%, elimination loss, tau 0.5.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py']

model = dict(type='IFND', loss_mode='elim')
pseudo_label_hook = dict(
    type='PseudoLabelHook',
    num_clusters=[100, 300, 1000],
    interval=20,
    scheme='linear',
    final_rate=1.0,
    feature='z',
    confidence='kappa',
    pipeline={{_base_.eval_pipeline}},
    kmeans=dict(niter=20, nredo=5, max_points_per_centroid=1000, min_points_per_centroid=10),
)
custom_hooks = [pseudo_label_hook, {{_base_.knn_hook}}]
