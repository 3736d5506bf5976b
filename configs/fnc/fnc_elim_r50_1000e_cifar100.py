# FNC, false negative cancellation (Huynh et al., WACV 2022), by elimination on SimCLR's
# CIFAR-100 recipe: the false negatives found through support views leave the denominator.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py', '../_base_/fn_detection.py']

# S = 4 support views per image: more views give steadier scores, each one more forward pass.
support_views = 4
model = dict(
    type='FNC',
    treatment='elim',
    num_support_views=support_views,
    # top_k = 2 images per anchor: a global batch of 1024 holds about 10 of its class (100 classes).
    top_k=2,
    # aggregation 'mean' over the support views: one odd view cannot flag an image on its own.
    aggregation='mean',
)
train_dataloader = dict(dataset=dict(pipeline=dict(num_views=2 + support_views)))
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
