# ImageNet-1k with MoCo v3's views, BYOL's asymmetric pair: crop (0.08, 1) (the ViT recipes'; the
# ResNet-50 recipes take (0.2, 1)), jitter (0.4, 0.4, 0.2, 0.1) with probability 0.8, grayscale
# 0.2, blur with probability 1.0 in the first view and 0.1 in the second, solarisation (at 128 of
# 255) with probability 0.2 in the second only, flip; batch 4096 over 16 GPUs.
_base_ = ['imagenet.py']
view = dict(type='ContrastiveView', size=224, scale=(0.08, 1.0), jitter=(0.4, 0.4, 0.2, 0.1))
train_dataloader = dict(
    batch_size=256,  # per GPU: 16 GPUs x 256 = 4096
    dataset=dict(pipeline=dict(type='MultiView', transforms=[dict(view, blur_p=1.0),
                                                             dict(view, blur_p=0.1, solarize_p=0.2)])))
