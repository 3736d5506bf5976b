# MoCo v3 with ResNet-50 (the authors' MoCo_ResNet): the pooled 2048-d feature, a 2-layer
# projection MLP (4096 wide, to 256) with a last BN without affine, a 2-layer prediction MLP with
# no last BN (so MLPNeck gives its last linear layer a bias, which the authors' has not); m0 = 0.99
# on a cosine to 1, tau = 1.0. timm's resnet50 zero-initialises each block's last BN
# (zero_init_last), as the authors' zero_init_residual=True.
model = dict(
    type='MoCoV3',
    momentum=0.99,
    temperature=1.0,
    # NHWC weights and inputs: faster convolutions on GPUs, the same results on a CPU.
    # compile='auto': torch.compile where CUDA is present, not on a CPU.
    backbone=dict(type='TimmBackbone', model_name='resnet50', channels_last=True, compile='auto'),
    neck=dict(type='MLPNeck', hidden_dim=4096, out_dim=256, num_layers=2, with_bn=True,
              with_last_bn=True, last_bn_affine=False),
    predictor=dict(type='MLPNeck', hidden_dim=4096, out_dim=256, num_layers=2, with_bn=True,
                   with_last_bn=False),
    data_preprocessor=dict(type='ContrastiveDataPreprocessor'),
)
