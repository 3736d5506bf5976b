# Linear evaluation on Fashion-MNIST for the ResNet-18 (CIFAR stem) pre-training configs
# (simclr/ifnd/supcon_r18_200e_fmnist.py): the small-image recipe of linear_r50_100e_cifar10.py
# (SupContrast's SimCLR linear evaluation: frozen backbone, one FC layer, 100 epochs, batch 512,
# SGD lr 1, momentum 0.9, wd 0, x0.2 at 60/75/90) on 28-pixel crops.
# Run: python tools/train.py configs/benchmarks/linear/linear_r18_100e_fmnist.py \
#          --cfg-options model.pretrained=work_dirs/ifnd_r18_200e_fmnist/epoch_200.pth
# For the demo's encoder (tools/demo.py) add its backbone settings:
#          model.backbone.cifar_stem=False "model.backbone.channels=(32,64,128,256)"
_base_ = ['../../_base_/datasets/fmnist.py', '../../_base_/default_runtime.py']

model = dict(
    type='ImageClassifier',
    # Must match the pre-training config's backbone; the loader refuses mismatched weights.
    backbone=dict(type='TimmBackbone', model_name='resnet18', cifar_stem=True),
    num_classes=10,
    pretrained=None,  # --cfg-options model.pretrained=CKPT
    frozen=True,
    head_norm=False,
    data_preprocessor=dict(type='ContrastiveDataPreprocessor', mean={{_base_.mean}},
                           std={{_base_.std}}),
)

train_pipeline = dict(type='ContrastiveView', size=28, scale=(0.2, 1.0), jitter_p=0.0,
                      grayscale_p=0.0, flip=True)
train_dataloader = dict(
    batch_size=512,
    drop_last=False,
    dataset=dict(pipeline=dict(_delete_=True, **train_pipeline)),
)
val_dataloader = dict(
    batch_size=512,
    num_workers=2,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset={{_base_.val_dataset}},
)
val_evaluator = dict(type='Accuracy', topk=(1, 5))
val_cfg = dict()
test_dataloader = val_dataloader
test_evaluator = val_evaluator
test_cfg = dict()

optim_wrapper = dict(type='OptimWrapper',
                     optimizer=dict(type='SGD', lr=1.0, momentum=0.9, weight_decay=0.0))
param_scheduler = [dict(type='MultiStepLR', by_epoch=True, milestones=[60, 75, 90], gamma=0.2)]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=100, val_interval=10)
auto_scale_lr = dict(base_batch_size=512, enable=False)
default_hooks = dict(checkpoint=dict(interval=20))

# The backbone's weights and BN buffers are fingerprinted before training; any change fails the run.
custom_hooks = [dict(type='FrozenBackboneCheckHook')]
