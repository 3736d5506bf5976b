_base_ = [
    '../_base_/models/simclr_r50.py',
    '../_base_/datasets/fmnist.py',
    '../_base_/schedules/sgd_coslr_200e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    backbone=dict(model_name='resnet18', cifar_stem=True),
    neck=dict(hidden_dim=512),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
