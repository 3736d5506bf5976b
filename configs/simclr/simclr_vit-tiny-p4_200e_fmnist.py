# SimCLR on Fashion-MNIST with the ViT of mocov3/mocov3_vit-tiny-p4_200e_fmnist.py (ViT-Tiny, 4-pixel
# patches) and its AdamW schedule, the data settings of simclr_r18_200e_fmnist.py; a 3-layer head
# 1024 wide to 128, tau = 0.2 (MoCo v3's).
_base_ = [
    '../_base_/models/simclr_r50.py',
    '../_base_/models/vit-tiny-p4.py',
    '../_base_/datasets/fmnist.py',
    '../_base_/schedules/adamw_coslr_200e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    temperature=0.2,
    backbone=dict(_base_.vit_tiny_p4, _delete_=True),
    neck=dict(hidden_dim=1024, out_dim=128),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
