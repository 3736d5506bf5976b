# MoCo v2 / PCL ImageNet schedule: SGD lr 0.03 (batch 256), wd 1e-4, x0.1 at 120 and 160.
# fused=True: one kernel for the whole update, on CUDA and on the CPU (torch >= 2.4).
optim_wrapper = dict(type='OptimWrapper',
                     optimizer=dict(type='SGD', lr=0.03, momentum=0.9, weight_decay=1e-4,
                                    fused=True))
param_scheduler = [dict(type='MultiStepLR', by_epoch=True, milestones=[120, 160], gamma=0.1)]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=200)
auto_scale_lr = dict(base_batch_size=256, enable=False)
