# Linear evaluation on digits for the digits protocol's pre-training configs (*_r18_8e_digits.py):
# the small-image recipe of linear_r50_100e_cifar10.py (SupContrast's SimCLR linear evaluation:
# frozen backbone, one FC layer, 100 epochs, SGD lr 1, momentum 0.9, wd 0, x0.2 at 60/75/90) on
# 16-pixel crops, at batch 128: the 1,347 training images make 11 steps an epoch (3 at batch 512).
# The digits protocol trains it for 10 epochs (benchmarks/false_negatives.py --preset digits).
# Run: python tools/train.py configs/benchmarks/linear/linear_r18_100e_digits.py \
#          --cfg-options model.pretrained=work_dirs/simclr_r18_8e_digits/epoch_8.pth
_base_ = ['./linear_r50_100e_cifar10.py']

# The pre-training configs' backbone and normalisation.
model = dict(
    backbone=dict(model_name='resnet18', cifar_stem=True, channels=(8, 16, 32, 64)),
    data_preprocessor=dict(mean=(0.2, 0.2, 0.2), std=(0.3, 0.3, 0.3)),
)
# The pre-training crops (scale 0.5-1, no flip: digits are not mirror-symmetric), no colour.
train_pipeline = dict(type='ContrastiveView', size=16, scale=(0.5, 1.0), jitter_p=0.0,
                      grayscale_p=0.0, flip=False)
train_dataloader = dict(
    batch_size=128, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='Digits', split='train', pipeline=train_pipeline))
val_dataloader = dict(
    num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='Digits', split='test',
                 pipeline=dict(type='EvalView', size=16)))
test_dataloader = val_dataloader
default_hooks = dict(checkpoint=dict(interval=20))
