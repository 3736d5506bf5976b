# MoCo v3, ViT-Small/16 on ImageNet-1k, 300 epochs (Chen, Xie and He, ICCV 2021): batch 4096,
# AdamW lr 1.5e-4 x 4096/256 = 2.4e-3, wd 0.1, 40 warm-up epochs, cosine; m0 = 0.99, tau = 0.2.
# Run: tools/dist_train.sh configs/mocov3/mocov3_vit-small-p16_300e_in1k.py 16
_base_ = [
    '../_base_/models/mocov3_vit-small-p16.py',
    # the paper's asymmetric views (BYOL's), batch 256 a GPU
    '../_base_/datasets/imagenet_mocov3.py',
    '../_base_/schedules/adamw_coslr_300e.py',
    '../_base_/default_runtime.py',
]
# bfloat16 autocast without a loss scaler where CUDA is present, float32 on a CPU.
optim_wrapper = dict(type='AutoAmpOptimWrapper')
