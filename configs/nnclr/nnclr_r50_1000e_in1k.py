# NNCLR on ImageNet-1k, the recipe of Dwibedi et al. (ICCV 2021, Sec. 4.1): ResNet-50; a projection
# MLP [2048, 2048, 256] with BN after each layer and a prediction MLP [4096, 256]; a support set of
# 98,304 projections; tau = 0.1; BYOL's augmentations; batch 4096 for 1000 epochs of LARS (lr 0.3 x
# batch / 256, weight decay 1e-6, 10 warm-up epochs, cosine).
# Run: tools/dist_train.sh configs/nnclr/nnclr_r50_1000e_in1k.py 16
_base_ = [
    '../_base_/datasets/imagenet_mocov3.py',  # BYOL's asymmetric views, batch 256 a GPU
    '../_base_/schedules/lars_coslr_1000e.py',
    '../_base_/default_runtime.py',
]
model = dict(
    type='NNCLR',
    support_size=98304,
    temperature=0.1,
    # NHWC weights and inputs: faster convolutions on GPUs; compile='auto': torch.compile on CUDA.
    backbone=dict(type='TimmBackbone', model_name='resnet50', channels_last=True, compile='auto'),
    neck=dict(type='MLPNeck', hidden_dim=2048, out_dim=256, num_layers=3, with_last_bn=True),
    predictor=dict(type='MLPNeck', hidden_dim=4096, num_layers=2, with_last_bn=False),
    data_preprocessor=dict(type='ContrastiveDataPreprocessor'),
)
# bfloat16 autocast without a loss scaler where CUDA is present, float32 on a CPU.
optim_wrapper = dict(type='AutoAmpOptimWrapper')
