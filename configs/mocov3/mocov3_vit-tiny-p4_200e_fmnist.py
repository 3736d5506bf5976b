# MoCo v3 on Fashion-MNIST (28 pixels) with ViT-Tiny cut to 4-pixel patches, the data settings of
# simclr/simclr_r18_200e_fmnist.py (batch 256, 200 epochs). Heads 1024 wide to 128; AdamW lr 5e-4
# at batch 256, wd 0.05, a 10-epoch warm-up, cosine; gradients clipped at norm 3.
_base_ = [
    '../_base_/models/mocov3_vit-small-p16.py',
    '../_base_/models/vit-tiny-p4.py',
    '../_base_/datasets/fmnist.py',
    '../_base_/schedules/adamw_coslr_200e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    backbone=dict(_base_.vit_tiny_p4, _delete_=True),
    neck=dict(hidden_dim=1024, out_dim=128),
    predictor=dict(hidden_dim=1024, out_dim=128),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
