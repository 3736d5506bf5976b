_base_ = [
    '../_base_/models/mocov2_r50.py',
    '../_base_/datasets/imagenet.py',
    '../_base_/schedules/sgd_steplr_200e.py',
    '../_base_/default_runtime.py',
]
