# PCL as in the paper's PCL table (SimCLR base, CIFAR-100): ProtoNCE, step acceptance after
# epoch 100, {2500, 5000, 10000} clusters, PCL's per-cluster concentration as the confidence.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py']

model = dict(type='PCL', loss_mode='inst')
pseudo_label_hook = dict(
    type='PseudoLabelHook',
    num_clusters=[2500, 5000, 10000],
    interval=20,
    scheme='step',
    step_epoch=100,
    final_rate=1.0,
    feature='z',
    confidence='pcl',
    pipeline={{_base_.eval_pipeline}},
    kmeans=dict(niter=20, nredo=5, max_points_per_centroid=1000, min_points_per_centroid=10),
)
custom_hooks = [pseudo_label_hook, {{_base_.knn_hook}}]
