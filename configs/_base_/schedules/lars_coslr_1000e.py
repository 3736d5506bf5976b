# Large-batch SimCLR v1 schedule: LARS, lr 0.3 x batch/256 (scaled to the real total batch by
# auto_scale_lr: 4.8 at batch 4096), momentum 0.9, wd 1e-6; the 10-epoch warm-up and cosine decay
# of the 1000-epoch SGD schedule. BN and bias parameters get neither weight decay nor the LARS
# trust ratio (timm's Lars adapts only parameters with weight decay), as in SimCLR.
_base_ = ['sgd_coslr_1000e.py']

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='LARS', lr=0.3, momentum=0.9, weight_decay=1e-6, trust_coeff=0.001),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
auto_scale_lr = dict(base_batch_size=256, enable=True)
