# Mask R-CNN R50-C4 with the 1x schedule: 90k iterations, lr x0.1 at 60k and 80k; otherwise the
# 2x protocol (mask_rcnn_r50_c4_2x_coco.py).
_base_ = ['mask_rcnn_r50_c4_2x_coco.py']

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', by_epoch=False, milestones=[60000, 80000], gamma=0.1),
]
train_cfg = dict(max_iters=90000, val_interval=90000)
