# SimCLR at the CPU-demo budget: a quarter of Fashion-MNIST for 8 epochs with a half-width
# ResNet-18 (standard stem, so 28-pixel inputs shrink early). The IFND demo inherits from it.
_base_ = ['simclr_r18_200e_fmnist.py']

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
knn_hook = dict(type='KNNEvalHook', val_dataset={{_base_.val_dataset}},
                pipeline={{_base_.eval_pipeline}}, interval=4, eval_at_start=True)
custom_hooks = [knn_hook]
