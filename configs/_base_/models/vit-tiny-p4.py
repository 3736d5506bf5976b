# ViT-Tiny cut to 4-pixel patches for 28-pixel images (49 patch tokens and the class token; 192
# wide, 12 blocks, 3 heads), with MoCo v3's stabilisers: the class token as the feature, the random
# patch projection frozen, a fixed 2-D sin-cos position embedding. Not compiled: at this size
# compiling takes longer than a short run trains. A leaf config takes it as its backbone:
#   model = dict(backbone=dict(_base_.vit_tiny_p4, _delete_=True))
vit_tiny_p4 = dict(type='ViTBackbone', model_name='vit_tiny_patch16_224', img_size=28, patch_size=4,
                   num_heads=3, global_pool='token', frozen_patch_embed=True, sincos_pos_embed=True,
                   compile=False)
