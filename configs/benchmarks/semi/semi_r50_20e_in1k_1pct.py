# Semi-supervised fine-tuning on 1% of ImageNet-1k labels (paper App. A / Table 3): the whole
# ResNet-50 and a linear classifier trained for 20 epochs on SimCLR's 1% subset, SGD momentum 0.9,
# weight decay 5e-4, batch 256 (8 GPUs x 32); lr 0.01 for the backbone and 1 for the classifier
# (lr 1 x lr_mult 0.01), all x0.2 at epochs 12 and 16. The paper reports top-5 accuracy.
# Subset lists: SimCLR's 1percent.txt / 10percent.txt (one image file name a line, e.g.
# 'n01440764_10026.JPEG') saved under data/imagenet/subsets/.
# Run: tools/dist_train.sh configs/benchmarks/semi/semi_r50_20e_in1k_1pct.py 8 \
#          --cfg-options model.pretrained=work_dirs/ifnd_r50_200e_in1k/epoch_200.pth
_base_ = ['../linear/linear_r50_100e_in1k.py']

model = dict(frozen=False)
train_dataloader = dict(dataset=dict(subset_file='data/imagenet/subsets/1percent.txt'))
optim_wrapper = dict(
    optimizer=dict(lr=1.0, momentum=0.9, weight_decay=5e-4),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.01)}),
)
param_scheduler = [dict(type='MultiStepLR', by_epoch=True, milestones=[12, 16], gamma=0.2)]
train_cfg = dict(max_epochs=20, val_interval=5)
default_hooks = dict(checkpoint=dict(interval=5))
# The backbone is trained here: no FrozenBackboneCheckHook.
custom_hooks = []
