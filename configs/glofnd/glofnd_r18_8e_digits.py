# GloFND (Balmaseda et al., ICML 2025) on digits: each image learns a similarity threshold above
# which a share alpha of its negatives lie; those are eliminated.
_base_ = ['../simclr/simclr_r18_8e_digits.py', '../_base_/fn_detection.py']

# alpha 0.1: one class in ten. start_epoch: about a third of the 8 epochs, once the embedding has
# structure (the authors start at 70 of 200 on ImageNet-100). lr: lambda's Adam step, the
# authors' 0.05.
glofnd = dict(type='GloFND', alpha=0.1, start_epoch=3, lr=0.05)
model = dict(detector=glofnd, treatment='elim')
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
