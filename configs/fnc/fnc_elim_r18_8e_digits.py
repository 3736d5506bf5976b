# FNC, false negative cancellation (Huynh et al., WACV 2022), by elimination on digits: the false
# negatives found through support views leave the denominator.
_base_ = ['../simclr/simclr_r18_8e_digits.py', '../_base_/fn_detection.py']

# S = 2 support views per image: each costs one more forward pass of the batch (no gradient).
support_views = 2
model = dict(
    type='FNC',
    strategy='elim',
    num_support_views=support_views,
    # top_k = 5 images per anchor (the Fashion-MNIST configs'): a batch of 64 holds about 6 of
    # its class.
    top_k=5,
    # aggregation 'mean' over the support views: steadier than the max of S = 2 cosines.
    aggregation='mean',
)
train_dataloader = dict(dataset=dict(pipeline=dict(num_views=2 + support_views)))
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
