_base_ = [
    '../_base_/models/mocov2_r50.py',
    '../_base_/datasets/imagenet.py',
    '../_base_/schedules/sgd_steplr_200e.py',
    '../_base_/default_runtime.py',
]
# bfloat16 autocast without a loss scaler where CUDA is present, float32 on a CPU
# (optim_wrapper.type=OptimWrapper: float32 everywhere).
optim_wrapper = dict(type='AutoAmpOptimWrapper')
