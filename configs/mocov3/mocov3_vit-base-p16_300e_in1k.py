# MoCo v3, ViT-Base/16 on ImageNet-1k, 300 epochs: the ViT-Small recipe with the base network
# (768 wide, 12 blocks, 12 heads; m0 = 0.99 for ViT-S and ViT-B alike).
_base_ = ['mocov3_vit-small-p16_300e_in1k.py']
model = dict(backbone=dict(model_name='vit_base_patch16_224', num_heads=12))
