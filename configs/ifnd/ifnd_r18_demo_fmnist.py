# The `make demo` run: IFND at the CPU-demo budget of configs/simclr/simclr_r18_demo_fmnist.py,
# k-means with [10, 30, 100] clusters every 2 epochs, linear acceptance 0 -> 100%.
_base_ = ['../simclr/simclr_r18_demo_fmnist.py']

model = dict(type='IFND', loss_mode='elim')
pseudo_label_hook = dict(
    type='PseudoLabelHook',
    num_clusters=[10, 30, 100],
    interval=2,
    scheme='linear',
    final_rate=1.0,
    feature='z',
    confidence='kappa',
    pipeline={{_base_.eval_pipeline}},
    kmeans=dict(niter=20, nredo=2, max_points_per_centroid=1000, min_points_per_centroid=10),
)
custom_hooks = [pseudo_label_hook, {{_base_.knn_hook}}]
