# Linear evaluation on Fashion-MNIST for the ViT-Tiny (4-pixel patches) pre-training configs
# (simclr/mocov3/ifnd/supcon/hcsc *_vit-tiny-p4_200e_fmnist.py): linear_r18_100e_fmnist.py's
# recipe on the class token. The backbone's sizes are read from the checkpoint's config.
_base_ = ['./linear_r18_100e_fmnist.py', '../../_base_/models/vit-tiny-p4.py']

model = dict(backbone=dict(_base_.vit_tiny_p4, _delete_=True))
