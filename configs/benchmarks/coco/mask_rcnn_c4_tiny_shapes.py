# A CPU-sized Mask R-CNN C4 run on the generated shapes set (tools/make_coco_shapes.py): the
# protocol of mask_rcnn_r50_c4_1x_coco.py scaled down (128-pixel images, 3 classes, small anchors
# and RoI batches, 100 iterations, plain BN) to check the whole pipeline in under a minute:
#   python tools/make_coco_shapes.py data/coco_shapes
#   python tools/transfer_coco.py CKPT --engine torchvision \
#       --config configs/benchmarks/coco/mask_rcnn_c4_tiny_shapes.py --data-root data/coco_shapes
_base_ = ['mask_rcnn_r50_c4_1x_coco.py']

data_root = 'data/coco_shapes/'
model = dict(
    num_classes=3,
    norm='BN',
    min_size_train=(160, 192),  # the 128-pixel images upscaled: res4 at stride 16 gets 12x12
    min_size_test=192,
    max_size=256,
    anchor_sizes=(16, 32, 64),
    detector_kwargs=dict(
        rpn_pre_nms_top_n_train=600, rpn_post_nms_top_n_train=128,
        rpn_pre_nms_top_n_test=300, rpn_post_nms_top_n_test=64,
        rpn_batch_size_per_image=64, box_batch_size_per_image=32,
    ),
)
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root))
val_dataloader = dict(num_workers=0, dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(data_root=data_root)
test_evaluator = val_evaluator

optim_wrapper = dict(optimizer=dict(lr=0.02))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=10),
    dict(type='MultiStepLR', by_epoch=False, milestones=[80], gamma=0.1),
]
train_cfg = dict(max_iters=100, val_interval=100)
custom_hooks = [dict(type='PreciseBNHook', num_iters=4)]
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=50))
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(vis_backends=vis_backends)
