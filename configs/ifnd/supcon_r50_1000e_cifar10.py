# SupCon, the oracle: the attraction loss with ground-truth labels, same recipe as IFND.
_base_ = ['../simclr/simclr_r50_1000e_cifar10.py']

model = dict(type='SupCon')
