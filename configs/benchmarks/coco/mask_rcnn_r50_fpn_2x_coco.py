# Mask R-CNN R50-FPN, 2x schedule (180k iterations, lr x0.1 at 120k and 160k).
_base_ = ['mask_rcnn_r50_fpn_1x_coco.py']

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', by_epoch=False, milestones=[120000, 160000], gamma=0.1),
]
train_cfg = dict(max_iters=180000, val_interval=180000)
