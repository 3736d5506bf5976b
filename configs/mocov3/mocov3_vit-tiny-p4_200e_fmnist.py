# MoCo v3 on Fashion-MNIST (28 pixels) with ViT-Tiny cut to 4-pixel patches (49 tokens and the
# class token), the data settings of simclr/simclr_r18_200e_fmnist.py (batch 256, 200 epochs).
# Heads 1024 wide to 128; AdamW lr 5e-4 at batch 256, wd 0.05, a 10-epoch warm-up, cosine;
# gradients clipped at norm 3.
_base_ = [
    '../_base_/models/mocov3_vit-small-p16.py',
    '../_base_/datasets/fmnist.py',
    '../_base_/schedules/adamw_coslr_300e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    backbone=dict(model_name='vit_tiny_patch16_224', img_size=28, patch_size=4, num_heads=3,
                  compile=False),
    neck=dict(hidden_dim=1024, out_dim=128),
    predictor=dict(hidden_dim=1024, out_dim=128),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
optim_wrapper = dict(optimizer=dict(lr=5e-4, weight_decay=0.05), clip_grad=dict(max_norm=3.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=190, by_epoch=True, begin=10, end=200,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=200)
auto_scale_lr = dict(base_batch_size=256, enable=False)
