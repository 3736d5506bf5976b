# MoCo v3, ResNet-50 on ImageNet-1k, 100 epochs (Chen, Xie and He, ICCV 2021), as the authors'
# repository trains it (facebookresearch/moco-v3 at c349e6e24f40d3fedb22d973f92defa4cedf37a7:
# main_moco.py's defaults, moco/builder.py's MoCo_ResNet heads, CONFIG.md's command
# `--moco-m-cos --crop-min=.2`): batch 4096, LARS lr 0.6 x 4096/256 = 9.6, momentum 0.9, wd 1e-6
# (BN and biases: no decay, no trust ratio), 10 warm-up epochs, cosine; m0 = 0.99, tau = 1.0.
# Small differences: the warm-up starts at 1e-3 x lr (theirs at 0), timm's LARS divides the trust
# ratio by |g| + wd |w| (theirs by |g + wd w|), bfloat16 autocast (theirs float16 with a scaler).
# Run: tools/dist_train.sh configs/mocov3/mocov3_r50_100e_in1k.py 16
_base_ = [
    '../_base_/models/mocov3_r50.py',
    '../_base_/datasets/imagenet_mocov3.py',  # BYOL's asymmetric views, batch 256 a GPU
    '../_base_/schedules/lars_coslr_1000e.py',
    '../_base_/default_runtime.py',
]
# The ViT recipes' views with crops of (0.2, 1) (the authors' --crop-min=.2 for ResNet-50).
view = dict(_base_.view, scale=(0.2, 1.0))
train_dataloader = dict(dataset=dict(pipeline=dict(
    transforms=[dict(t, scale=view['scale']) for t in _base_.train_dataloader.dataset.pipeline.transforms])))
# Every BN (backbone and heads) normalises over all processes' batch, as the authors' SyncBN.
sync_bn = 'torch'
# bfloat16 autocast without a loss scaler where CUDA is present, float32 on a CPU.
optim_wrapper = dict(type='AutoAmpOptimWrapper', optimizer=dict(lr=0.6, weight_decay=1e-6))
# The cosine's end and length left unset: the Runner takes them from max_epochs, so the longer
# recipes set only their epochs.
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=10, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=100)
