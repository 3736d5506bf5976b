# GloFND (Balmaseda et al., ICML 2025) on SimCLR's CIFAR-10 recipe: each image learns a similarity
# threshold above which a share alpha of its negatives lie; those are eliminated.
_base_ = ['../simclr/simclr_r50_1000e_cifar10.py', '../_base_/fn_detection.py']

# alpha 0.1: one class in ten. start_epoch: a quarter of the epochs, as on Fashion-MNIST, once
# the embedding has structure. lr: lambda's Adam step, the authors' 0.05.
glofnd = dict(type='GloFND', alpha=0.1, start_epoch=250, lr=0.05)
model = dict(detector=glofnd, treatment='elim')
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
