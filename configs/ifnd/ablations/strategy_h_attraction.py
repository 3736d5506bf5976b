# Strategy table [h]: linear 0 -> 100% with the attraction loss.
_base_ = ['../ifnd_r50_1000e_cifar100.py']

model = dict(treatment='attr')
