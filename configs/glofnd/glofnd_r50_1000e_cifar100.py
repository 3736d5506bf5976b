# GloFND on SimCLR's CIFAR-100 recipe: the CIFAR-10 config's with one class in a hundred.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py', '../_base_/fn_detection.py']

# alpha 0.01: one class in a hundred; start_epoch and lr as on CIFAR-10.
glofnd = dict(type='GloFND', alpha=0.01, start_epoch=250, lr=0.05)
model = dict(detector=glofnd, treatment='elim')
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
