# SupCon, the oracle on Fashion-MNIST with ViT-Tiny (4-pixel patches): attraction loss with
# ground-truth labels.
_base_ = ['../simclr/simclr_vit-tiny-p4_200e_fmnist.py']

model = dict(type='SupCon')
