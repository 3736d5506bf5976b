# MoCo v3, ViT-Small/16 on ImageNet-1k, 300 epochs (Chen, Xie and He, ICCV 2021): batch 4096,
# AdamW lr 1.5e-4 x 4096/256 = 2.4e-3, wd 0.1, 40 warm-up epochs, cosine; m0 = 0.99, tau = 0.2.
# Run: tools/dist_train.sh configs/mocov3/mocov3_vit-small-p16_300e_in1k.py 16
_base_ = [
    '../_base_/models/mocov3_vit-small-p16.py',
    '../_base_/datasets/imagenet.py',
    '../_base_/schedules/adamw_coslr_300e.py',
    '../_base_/default_runtime.py',
]
# The paper's asymmetric views (BYOL's): crop (0.08, 1), jitter (0.4, 0.4, 0.2, 0.1), blur with
# probability 1.0 in the first view and 0.1 in the second (its solarisation is not available here).
view = dict(type='ContrastiveView', size=224, scale=(0.08, 1.0), jitter=(0.4, 0.4, 0.2, 0.1))
train_dataloader = dict(
    batch_size=256,  # per GPU: 16 GPUs x 256 = 4096
    dataset=dict(pipeline=dict(type='MultiView', transforms=[dict(view, blur_p=1.0),
                                                             dict(view, blur_p=0.1)])))
# bfloat16 autocast without a loss scaler where CUDA is present, float32 on a CPU.
optim_wrapper = dict(type='AutoAmpOptimWrapper')
