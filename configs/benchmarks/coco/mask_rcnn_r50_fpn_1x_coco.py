# Mask R-CNN R50-FPN, 1x schedule, with the C4 protocol's normalisation choices (SyncBN, all layers
# fine-tuned, torchvision mean/std): FPN on res2-res5 plus a max-pooled P6, 4 conv + deconv mask
# head, two-FC box head on 7x7 RoIs; RPN keeps 2000 boxes per level before NMS and 1000 after in
# training, 1000/1000 at test (detectron2's FPN defaults).
_base_ = ['mask_rcnn_r50_c4_1x_coco.py']

model = dict(
    arch='FPN',
    res5_extra_norm=False,  # the extra norm belongs to the C4 RoI head
    anchor_sizes=(32, 64, 128, 256, 512),
    pooler_resolution=7,
    detector_kwargs=dict(
        rpn_pre_nms_top_n_train=2000, rpn_post_nms_top_n_train=1000,
        rpn_pre_nms_top_n_test=1000, rpn_post_nms_top_n_test=1000,
    ),
)
