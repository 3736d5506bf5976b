# NNCLR on Fashion-MNIST with the protocol's SimCLR recipe (simclr_r18_200e_fmnist.py: ResNet-18,
# CIFAR stem, the same views and schedule): the authors' heads at the protocol's width (projection
# [512, 512, 128], prediction [512, 128]) and a support set of 4,096 projections (the authors':
# 98,304 of ImageNet's 1.28M images).
_base_ = ['../simclr/simclr_r18_200e_fmnist.py', '../_base_/nnclr.py']
model = dict(_base_.nnclr, support_size=4096, predictor=dict(_base_.nnclr.predictor, hidden_dim=512))
