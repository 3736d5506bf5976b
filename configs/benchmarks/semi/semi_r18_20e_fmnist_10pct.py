# Semi-supervised fine-tuning on 10% of Fashion-MNIST labels: as the 1% config, with a
# class-balanced 10% subset and a classifier lr of 0.1 (backbone still 0.01 = 0.1 x lr_mult 0.1).
# Run: python tools/train.py configs/benchmarks/semi/semi_r18_20e_fmnist_10pct.py \
#          --cfg-options model.pretrained=work_dirs/ifnd_r18_200e_fmnist/epoch_200.pth
_base_ = ['./semi_r18_20e_fmnist_1pct.py']

train_dataloader = dict(dataset=dict(subset_fraction=0.1))
optim_wrapper = dict(
    optimizer=dict(lr=0.1),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}),
)
