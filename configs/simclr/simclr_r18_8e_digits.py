# SimCLR on scikit-learn's digits (1,347 training images, 8x8 upscaled to 16 pixels; 450 test
# images): the recipe of the digits false-negative protocol (benchmarks/false_negatives.py
# --preset digits), about 40 s per run with its linear probe on one CPU thread. An
# eighth-width ResNet-18 (widths 8-64) with the CIFAR stem (3x3, stride 1, no max-pool: 16 pixels
# would shrink to 1 by the last stage with the standard one), a 256-wide head to 128-d, τ = 0.2 (the
# CPU protocol's), batch 64 (21 steps an epoch) for 8 epochs; the views made in batches in the
# data preprocessor.
_base_ = [
    '../_base_/models/simclr_r50.py',
    '../_base_/datasets/digits.py',
    '../_base_/schedules/sgd_coslr_8e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    temperature=0.2,
    # Not compiled: a tiny model, whose compilation would take longer than its training.
    backbone=dict(model_name='resnet18', cifar_stem=True, channels=(8, 16, 32, 64), compile=False),
    neck=dict(hidden_dim=256),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
# augment_on='device': on a CPU too, batched views cost less than per-image ones (no workers).
train_dataloader = dict(batch_size=64, dataset=dict(augment_on='device'))
knn_hook = dict(type='KNNEvalHook', val_dataset={{_base_.val_dataset}},
                pipeline={{_base_.eval_pipeline}}, interval=2, num_workers=0)
custom_hooks = [knn_hook]
default_hooks = dict(logger=dict(interval=10))
