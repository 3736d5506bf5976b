# Short schedule of the digits protocol: SGD lr 0.25 (the Fashion-MNIST CPU protocol's) at batch
# 64, wd 1e-4, a 1-epoch linear warm-up, cosine decay to 8 epochs.
# fused=True: one kernel for the whole update, on CUDA and on the CPU (torch >= 2.4).
optim_wrapper = dict(type='OptimWrapper',
                     optimizer=dict(type='SGD', lr=0.25, momentum=0.9, weight_decay=1e-4,
                                    fused=True))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=7, by_epoch=True, begin=1, end=8,
         convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=8)
auto_scale_lr = dict(base_batch_size=64, enable=False)
