# The paper's CIFAR schedule: SGD lr 0.5 (batch 1024), wd 1e-4, 10-epoch linear warm-up, cosine.
# fused=True: one kernel for the whole update, on CUDA and on the CPU (torch >= 2.4).
optim_wrapper = dict(type='OptimWrapper',
                     optimizer=dict(type='SGD', lr=0.5, momentum=0.9, weight_decay=1e-4,
                                    fused=True))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=990, by_epoch=True, begin=10, end=1000,
         convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1000)
auto_scale_lr = dict(base_batch_size=1024, enable=False)
