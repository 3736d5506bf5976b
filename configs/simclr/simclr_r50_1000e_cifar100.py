_base_ = [
    '../_base_/models/simclr_r50.py',
    '../_base_/datasets/cifar100.py',
    '../_base_/schedules/sgd_coslr_1000e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    backbone=dict(cifar_stem=True),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
default_hooks = dict(checkpoint=dict(interval=20))
# bfloat16 autocast without a loss scaler where CUDA is present, float32 on a CPU
# (optim_wrapper.type=OptimWrapper: float32 everywhere).
optim_wrapper = dict(type='AutoAmpOptimWrapper')
