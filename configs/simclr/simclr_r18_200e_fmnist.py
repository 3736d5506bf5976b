_base_ = [
    '../_base_/models/simclr_r50.py',
    '../_base_/datasets/fmnist.py',
    '../_base_/schedules/sgd_coslr_200e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    # Not compiled: with views made by loader workers the step is rarely the bottleneck
    # (ifnd_r18_200e_fmnist_device_aug.py is the GPU recipe).
    backbone=dict(model_name='resnet18', cifar_stem=True, compile=False),
    neck=dict(hidden_dim=512),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
