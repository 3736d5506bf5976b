# The FPN variant of mask_rcnn_c4_tiny_shapes.py (same data, schedule and sizes; a 64-channel
# pyramid keeps it CPU-sized).
_base_ = ['mask_rcnn_c4_tiny_shapes.py']

model = dict(
    arch='FPN',
    res5_extra_norm=False,
    anchor_sizes=(8, 16, 32, 64, 128),
    pooler_resolution=7,
    fpn_channels=64,
)
