# NNCLR on a SimCLR recipe: the authors' heads at the recipe's width, a 3-layer projection MLP with
# BN after each layer and a 2-layer prediction MLP without a last BN. A leaf config merges it into
# its model and sets the support set's size and the prediction MLP's width:
#   model = dict(_base_.nnclr, support_size=4096, predictor=dict(_base_.nnclr.predictor, hidden_dim=512))
nnclr = dict(type='NNCLR', neck=dict(num_layers=3, with_last_bn=True),
             predictor=dict(type='MLPNeck', num_layers=2, with_last_bn=False))
