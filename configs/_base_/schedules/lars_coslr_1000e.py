# Large-batch SimCLR v1 schedule: LARS, lr 0.3 x batch/256 (scaled to the real total batch by
# auto_scale_lr: 4.8 at batch 4096), momentum 0.9, wd 1e-6, 10-epoch linear warm-up, cosine.
# BN and bias parameters get neither weight decay nor the LARS trust ratio (timm's Lars adapts
# only parameters with weight decay), as in SimCLR.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='LARS', lr=0.3, momentum=0.9, weight_decay=1e-6, trust_coeff=0.001),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=990, by_epoch=True, begin=10, end=1000,
         convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1000)
auto_scale_lr = dict(base_batch_size=256, enable=True)
