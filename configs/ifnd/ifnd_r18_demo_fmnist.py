# The `make demo` run: IFND on a quarter of Fashion-MNIST for 8 epochs, sized for a 2-core CPU
# (a half-width ResNet-18 with the standard stem, so 28-pixel inputs shrink early).
_base_ = ['ifnd_r18_200e_fmnist.py']

model = dict(backbone=dict(cifar_stem=False, channels=(32, 64, 128, 256)), neck=dict(hidden_dim=256))
train_dataloader = dict(dataset=dict(subset_fraction=0.25), persistent_workers=False)
optim_wrapper = dict(optimizer=dict(lr=0.25))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=7, by_epoch=True, begin=1, end=8,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=8)
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(interval=4))
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
knn_hook = dict(type='KNNEvalHook', val_dataset={{_base_.val_dataset}},
                pipeline={{_base_.eval_pipeline}}, interval=4, eval_at_start=True)
custom_hooks = [pseudo_label_hook, knn_hook]
