# FNC, false negative cancellation (Huynh et al., WACV 2022), as the ResNet-18 CPU recipes
# (Fashion-MNIST, digits) run it. A leaf config takes the model and widens the pipeline:
#   model = _base_._fnc_model
#   train_dataloader = dict(dataset=dict(pipeline=dict(num_views=2 + _base_.support_views)))

# S = 2 support views per image: each costs one more forward pass of the batch (no gradient).
support_views = 2
_fnc_model = dict(
    type='FNC',
    treatment='elim',
    num_support_views=support_views,
    # top_k = 5 images per anchor: a batch of 256 holds about 25 of its class (13 at batch 128,
    # 6 at the digits' 64).
    top_k=5,
    # aggregation 'mean' over the support views: steadier than the max of S = 2 cosines.
    aggregation='mean',
)
