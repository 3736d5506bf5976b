# COCO transfer (paper Table 5, MoCo's detection protocol): Mask R-CNN R50-C4 fine-tuned on COCO
# train2017 with the 2x schedule, evaluated on val2017 (bbox and mask AP, AP50, AP75).
# - backbone and res5 RoI head initialised from the pre-trained ResNet-50, all layers fine-tuned
#   (freeze_at=0), SyncBN everywhere, and one extra SyncBN after res5 in the RoI head;
# - RGB input normalised with torchvision's mean/std (the pre-training statistics), stride in the
#   3x3 conv of each bottleneck (STRIDE_IN_1X1=False, as timm/torchvision ResNets);
# - 180k iterations at 16 images (8 GPUs x 2), lr 0.02 with 1000 linear warm-up iterations, x0.1 at
#   120k and 160k; shorter side sampled from 640-800 in training, 800 at test, longer side <= 1333.
# The same file drives both engines of tools/transfer_coco.py: torchvision builds it through the
# Runner, detectron2 gets the equivalent config (ifnd/transfer/detectron2_config.py translates it).
# Run: tools/dist_transfer_coco.sh CKPT 8 --config configs/benchmarks/coco/mask_rcnn_r50_c4_2x_coco.py
_base_ = ['../../_base_/default_runtime.py']

data_root = 'data/coco/'
model = dict(
    type='MaskRCNN',
    arch='C4',
    # Used as is only without a checkpoint; a checkpoint brings its own backbone settings.
    backbone=dict(type='TimmBackbone', model_name='resnet50'),
    backbone_checkpoint=None,  # tools/transfer_coco.py sets it from CKPT
    num_classes=80,
    norm='SyncBN',
    res5_extra_norm=True,
    freeze_at=0,
    min_size_train=(640, 672, 704, 736, 768, 800),
    min_size_test=800,
    max_size=1333,
    pixel_mean=(0.485, 0.456, 0.406),
    pixel_std=(0.229, 0.224, 0.225),
    anchor_sizes=(32, 64, 128, 256, 512),
    aspect_ratios=(0.5, 1.0, 2.0),
    pooler_resolution=14,
    # torchvision's MaskRCNN arguments, at detectron2's values for a C4 model.
    detector_kwargs=dict(
        rpn_pre_nms_top_n_train=12000, rpn_post_nms_top_n_train=2000,
        rpn_pre_nms_top_n_test=6000, rpn_post_nms_top_n_test=1000,
        rpn_nms_thresh=0.7, rpn_fg_iou_thresh=0.7, rpn_bg_iou_thresh=0.3,
        rpn_batch_size_per_image=256, rpn_positive_fraction=0.5,
        box_fg_iou_thresh=0.5, box_bg_iou_thresh=0.5,
        box_batch_size_per_image=512, box_positive_fraction=0.25,
        box_score_thresh=0.05, box_nms_thresh=0.5, box_detections_per_img=100,
    ),
)

train_dataloader = dict(
    batch_size=2,  # per GPU: 8 GPUs x 2 = 16 images per iteration
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    # Landscape and portrait images in separate batches: less padding (detectron2's grouping).
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(type='CocoInstances', data_root=data_root,
                 ann_file='annotations/instances_train2017.json', img_dir='train2017', train=True),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(type='CocoInstances', data_root=data_root,
                 ann_file='annotations/instances_val2017.json', img_dir='val2017', train=False),
)
val_evaluator = dict(type='CocoMetric', data_root=data_root,
                     ann_file='annotations/instances_val2017.json', iou_types=('bbox', 'segm'))
val_cfg = dict()
test_dataloader = val_dataloader
test_evaluator = val_evaluator
test_cfg = dict()

# No weight decay on norm layers (detectron2's WEIGHT_DECAY_NORM = 0).
optim_wrapper = dict(type='OptimWrapper',
                     optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=1e-4),
                     paramwise_cfg=dict(norm_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', by_epoch=False, milestones=[120000, 160000], gamma=0.1),
]
# Evaluated once, after the last iteration (detectron2's TEST.EVAL_PERIOD = 0).
train_cfg = dict(type='IterBasedTrainLoop', max_iters=180000, val_interval=180000)
auto_scale_lr = dict(base_batch_size=16, enable=False)

# BN statistics re-estimated on 200 training batches before evaluation (TEST.PRECISE_BN).
custom_hooks = [dict(type='PreciseBNHook', num_iters=200)]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(by_epoch=False, interval=10000, max_keep_ckpts=3),
)
log_processor = dict(by_epoch=False)
# Image sizes vary from batch to batch: cuDNN autotuning would re-run for each new shape.
env_cfg = dict(cudnn_benchmark=False)
