# MoCo v3 on scikit-learn's digits (16 pixels) with ViT-Tiny cut to 4-pixel patches (16 tokens
# and the class token; 192 wide, 12 blocks, 3 heads), the digits protocol's data, batch and
# 8 epochs (as simclr/simclr_r18_8e_digits.py): the ViT recipe on a CPU, about 1 s a step on two
# threads (168 steps; model.backbone.depth=6 halves it). Heads 512 wide to
# 128; AdamW lr 1e-3 (no batch scaling), wd 0.05, a 1-epoch warm-up; gradients clipped at norm 3,
# a guard against the loss spikes small ViT batches give.
_base_ = [
    '../_base_/models/mocov3_vit-small-p16.py',
    '../_base_/datasets/digits.py',
    '../_base_/schedules/adamw_coslr_300e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    backbone=dict(model_name='vit_tiny_patch16_224', img_size=16, patch_size=4, num_heads=3,
                  compile=False),  # a tiny model: compiling would take longer than training
    neck=dict(hidden_dim=512, out_dim=128),
    predictor=dict(hidden_dim=512, out_dim=128),
    data_preprocessor=dict(mean={{_base_.mean}}, std={{_base_.std}}),
)
train_dataloader = dict(batch_size=64, dataset=dict(augment_on='device'))
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.05), clip_grad=dict(max_norm=3.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=7, by_epoch=True, begin=1, end=8,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=8)
auto_scale_lr = dict(base_batch_size=64, enable=False)
knn_hook = dict(type='KNNEvalHook', val_dataset={{_base_.val_dataset}},
                pipeline={{_base_.eval_pipeline}}, interval=2, num_workers=0)
custom_hooks = [knn_hook]
default_hooks = dict(logger=dict(interval=10))
