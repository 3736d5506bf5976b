# Linear evaluation on CIFAR-100: the CIFAR-10 recipe (SupContrast's SimCLR linear evaluation)
# with 100 classes and CIFAR-100's statistics (as in _base_/datasets/cifar100.py).
# Run: python tools/train.py configs/benchmarks/linear/linear_r50_100e_cifar100.py \
#          --cfg-options model.pretrained=work_dirs/ifnd_r50_1000e_cifar100/epoch_1000.pth
_base_ = ['./linear_r50_100e_cifar10.py']

data_root = 'data/cifar100'
model = dict(
    num_classes=100,
    data_preprocessor=dict(mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762)),
)
train_dataloader = dict(dataset=dict(type='CIFAR100', data_root=data_root))
val_dataloader = dict(dataset=dict(type='CIFAR100', data_root=data_root))
test_dataloader = val_dataloader
