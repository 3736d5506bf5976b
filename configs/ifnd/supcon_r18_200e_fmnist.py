# SupCon, the oracle on Fashion-MNIST: attraction loss with ground-truth labels.
_base_ = ['../simclr/simclr_r18_200e_fmnist.py']

model = dict(type='SupCon')
