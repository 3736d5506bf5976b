# Semi-supervised fine-tuning on 10% of Fashion-MNIST labels (class-balanced, drawn by subset_seed)
# for the ViT-Tiny (4-pixel patches) pre-training configs (simclr/mocov3/ifnd/supcon/hcsc
# *_vit-tiny-p4_200e_fmnist.py): the whole ViT, its patch projection included, and a linear
# classifier for the ResNet configs' 20 epochs at batch 256, with the ViT fine-tuning recipe of
# BEiT and MAE: AdamW lr 5e-4, betas (0.9, 0.999), wd 0.05 (none on norms, biases, pos_embed,
# cls_token), a 2-epoch warm-up then cosine, stochastic depth 0.1, and layer-wise lr decay 0.75:
# block i of 12 learns at lr x 0.75^(13 - i), the patch projection and the class token at
# lr x 0.75^13, the final norm and the classifier at lr. The backbone's sizes are read from the
# checkpoint's config.
# Run: python tools/train.py configs/benchmarks/semi/semi_vit-tiny-p4_20e_fmnist_10pct.py \
#          --cfg-options model.pretrained=work_dirs/mocov3_vit-tiny-p4_200e_fmnist/epoch_200.pth
# 1% of the labels: --cfg-options train_dataloader.dataset.subset_fraction=0.01
_base_ = ['../linear/linear_vit-tiny-p4_100e_fmnist.py']

model = dict(frozen=False, backbone=dict(frozen_patch_embed=False, drop_path_rate=0.1))
train_dataloader = dict(batch_size=256, dataset=dict(subset_fraction=0.1, subset_seed=0))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=5e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(layer_decay_rate=0.75, norm_decay_mult=0.0, bias_decay_mult=0.0,
                       custom_keys={'pos_embed': dict(decay_mult=0.0),
                                    'cls_token': dict(decay_mult=0.0)}),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=2,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=18, by_epoch=True, begin=2, end=20,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=20, val_interval=5)
auto_scale_lr = dict(base_batch_size=256, enable=False)
default_hooks = dict(checkpoint=dict(interval=5))
# The backbone is trained here: no FrozenBackboneCheckHook.
custom_hooks = []
