# Semi-supervised fine-tuning on 10% of ImageNet-1k labels: as the 1% config, with SimCLR's 10%
# subset and a classifier lr of 0.1 (backbone still 0.01 = 0.1 x lr_mult 0.1).
# Run: tools/dist_train.sh configs/benchmarks/semi/semi_r50_20e_in1k_10pct.py 8 \
#          --cfg-options model.pretrained=work_dirs/ifnd_r50_200e_in1k/epoch_200.pth
_base_ = ['./semi_r50_20e_in1k_1pct.py']

train_dataloader = dict(dataset=dict(subset_file='data/imagenet/subsets/10percent.txt'))
optim_wrapper = dict(
    optimizer=dict(lr=0.1),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}),
)
