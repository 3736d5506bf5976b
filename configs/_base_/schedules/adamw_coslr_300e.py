# MoCo v3's ViT schedule: AdamW lr 1.5e-4 x batch/256 (scaled to the real total batch by
# auto_scale_lr: 2.4e-3 at batch 4096), betas (0.9, 0.95), wd 0.1, a 40-epoch linear warm-up and
# cosine decay to 300 epochs. Norms (LayerNorm, BN), biases, the position embeddings and the class
# token take no weight decay (the ViT convention: decaying them only shrinks offsets and scales).
# The ViT recipes share these settings; a leaf config sets lr, epochs and the warm-up.
# Gradient clipping, where wanted: optim_wrapper = dict(clip_grad=dict(max_norm=...)) (the paper
# relies on the frozen patch projection instead); bfloat16: type='AutoAmpOptimWrapper'.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1.5e-4, betas=(0.9, 0.95), weight_decay=0.1),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                       custom_keys={'pos_embed': dict(decay_mult=0.0),
                                    'cls_token': dict(decay_mult=0.0)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=40,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=260, by_epoch=True, begin=40, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=300)
auto_scale_lr = dict(base_batch_size=256, enable=True)
