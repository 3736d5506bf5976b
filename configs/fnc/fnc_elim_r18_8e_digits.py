# FNC, false negative cancellation (Huynh et al., WACV 2022), by elimination on digits: the false
# negatives found through support views leave the denominator.
_base_ = ['../simclr/simclr_r18_8e_digits.py', '../_base_/fn_detection.py', '../_base_/fnc.py']

model = _base_._fnc_model
train_dataloader = dict(dataset=dict(pipeline=dict(num_views=2 + _base_.support_views)))
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
