# IFND on MoCo v3 (ResNet-50, ImageNet-1k, 100 epochs): the ViT-Small leaf's settings
# (ifnd_mocov3_vit-small-p16_300e_in1k.py) on the ResNet-50 recipe.
_base_ = ['../mocov3/mocov3_r50_100e_in1k.py', '../_base_/pseudo_labels.py',
          '../_base_/fn_detection.py']

model = dict(type='IFNDMoCoV3')  # elimination (Eq. 3), the preset's treatment
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[1000, 3000, 10000], interval=1,
    pipeline=_base_.eval_pipeline, batch_size=256, num_workers=8)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
