# NNCLR on digits with the digits protocol's SimCLR recipe (simclr_r18_8e_digits.py): a support set
# of 512 projections (of 1,347 training images), the authors' heads at the recipe's width.
_base_ = ['../simclr/simclr_r18_8e_digits.py', '../_base_/nnclr.py']
model = dict(_base_.nnclr, support_size=512, predictor=dict(_base_.nnclr.predictor, hidden_dim=256))
