# Linear evaluation on Fashion-MNIST for the ResNet-18 (CIFAR stem) pre-training configs
# (simclr/ifnd/supcon_r18_200e_fmnist.py): the small-image recipe of linear_r50_100e_cifar10.py
# (SupContrast's SimCLR linear evaluation: frozen backbone, one FC layer, 100 epochs, batch 512,
# SGD lr 1, momentum 0.9, wd 0, x0.2 at 60/75/90) on 28-pixel crops.
# Run: python tools/train.py configs/benchmarks/linear/linear_r18_100e_fmnist.py \
#          --cfg-options model.pretrained=work_dirs/ifnd_r18_200e_fmnist/epoch_200.pth
# For the demo's encoder (tools/demo.py) add its backbone settings:
#          model.backbone.cifar_stem=False "model.backbone.channels=(32,64,128,256)"
_base_ = ['./linear_r50_100e_cifar10.py']

data_root = '/usr/share/datasets/fashion-mnist'
data = dict(type='FashionMNIST', data_root=data_root)

model = dict(
    backbone=dict(model_name='resnet18'),
    data_preprocessor=dict(mean=(0.2860, 0.2860, 0.2860), std=(0.3530, 0.3530, 0.3530)),
)
train_dataloader = dict(num_workers=2, dataset=dict(**data, pipeline=dict(size=28)))
val_dataloader = dict(num_workers=2, dataset=dict(**data, pipeline=dict(size=28)))
test_dataloader = val_dataloader
default_hooks = dict(checkpoint=dict(interval=20))
