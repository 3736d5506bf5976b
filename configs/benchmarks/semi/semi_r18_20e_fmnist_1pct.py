# Semi-supervised fine-tuning on 1% of Fashion-MNIST labels (600 images, class-balanced, drawn
# by subset_seed): the paper's ImageNet recipe on the ResNet-18 (CIFAR stem) pre-training configs.
# All weights trained for 20 epochs, batch 256, SGD momentum 0.9, weight decay 5e-4; lr 0.01 for
# the backbone and 1 for the classifier (lr 1 x lr_mult 0.01), x0.2 at epochs 12 and 16.
# Run: python tools/train.py configs/benchmarks/semi/semi_r18_20e_fmnist_1pct.py \
#          --cfg-options model.pretrained=work_dirs/ifnd_r18_200e_fmnist/epoch_200.pth
# To use a fixed list instead (tools/make_subset.py): train_dataloader.dataset.subset_fraction=None
#          train_dataloader.dataset.subset_file=FILE
_base_ = ['../linear/linear_r18_100e_fmnist.py']

model = dict(frozen=False)
train_dataloader = dict(batch_size=256, dataset=dict(subset_fraction=0.01, subset_seed=0))
optim_wrapper = dict(
    optimizer=dict(lr=1.0, momentum=0.9, weight_decay=5e-4),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.01)}),
)
param_scheduler = [dict(type='MultiStepLR', by_epoch=True, milestones=[12, 16], gamma=0.2)]
train_cfg = dict(max_epochs=20, val_interval=5)
auto_scale_lr = dict(base_batch_size=256, enable=False)
default_hooks = dict(checkpoint=dict(interval=5))
# The backbone is trained here: no FrozenBackboneCheckHook.
custom_hooks = []
