# FNC, false negative cancellation (Huynh et al., WACV 2022), by elimination on SimCLR's
# Fashion-MNIST recipe: the false negatives found through support views leave the denominator.
_base_ = ['../simclr/simclr_r18_200e_fmnist.py', '../_base_/fn_detection.py', '../_base_/fnc.py']

model = _base_._fnc_model
train_dataloader = dict(dataset=dict(pipeline=dict(num_views=2 + _base_.support_views)))
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
