# MoCo v3 with ViT-Small/16 (the paper's: 12 heads, where timm's vit_small has 6), the class token
# as the feature, the random patch projection frozen, a fixed 2-D sin-cos position embedding; a
# 3-layer projection MLP (4096 wide, to 256)
# and a 2-layer prediction MLP, each with a last BN without affine; m0 = 0.99 on a cosine to 1,
# tau = 0.2.
model = dict(
    type='MoCoV3',
    momentum=0.99,
    temperature=0.2,
    # compile='auto': torch.compile where CUDA is present, not on a CPU.
    backbone=dict(type='ViTBackbone', model_name='vit_small_patch16_224', num_heads=12,
                  global_pool='token', frozen_patch_embed=True, sincos_pos_embed=True,
                  compile='auto'),
    neck=dict(type='MLPNeck', hidden_dim=4096, out_dim=256, num_layers=3, with_bn=True,
              with_last_bn=True, last_bn_affine=False),
    predictor=dict(type='MLPNeck', hidden_dim=4096, out_dim=256, num_layers=2, with_bn=True,
                   with_last_bn=True, last_bn_affine=False),
    data_preprocessor=dict(type='ContrastiveDataPreprocessor'),
)
