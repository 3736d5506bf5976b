# The ViT schedule (adamw_coslr_300e.py) for the 28-pixel data sets' 200 epochs at batch 256:
# AdamW lr 5e-4, wd 0.05, a 10-epoch warm-up, cosine; gradients clipped at norm 3, a guard against
# the loss spikes small ViT batches give.
_base_ = ['./adamw_coslr_300e.py']

optim_wrapper = dict(optimizer=dict(lr=5e-4, weight_decay=0.05), clip_grad=dict(max_norm=3.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=190, by_epoch=True, begin=10, end=200,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=200)
auto_scale_lr = dict(base_batch_size=256, enable=False)
