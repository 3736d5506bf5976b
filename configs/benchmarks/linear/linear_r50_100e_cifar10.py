# Linear evaluation on CIFAR-10 for the SimCLR-based CIFAR pre-training (ResNet-50, CIFAR stem).
# The paper gives no CIFAR recipe; this is SupContrast's SimCLR linear evaluation (the code base
# whose CIFAR pre-training recipe the paper follows): frozen backbone in eval mode, one FC layer,
# 100 epochs, batch 512, SGD lr 1, momentum 0.9, weight decay 0, lr x0.2 at 60, 75 and 90.
# Train: RandomResizedCrop(32, scale 0.2-1) + flip; eval: the 32-pixel image as it is.
# Batch 512 is for one GPU; with N GPUs set train_dataloader.batch_size=512/N.
# Run: python tools/train.py configs/benchmarks/linear/linear_r50_100e_cifar10.py \
#          --cfg-options model.pretrained=work_dirs/ifnd_r50_1000e_cifar10/epoch_1000.pth
_base_ = ['../../_base_/datasets/cifar10.py', '../../_base_/default_runtime.py']

model = dict(
    type='ImageClassifier',
    # Must match the pre-training config's backbone; the loader refuses mismatched weights.
    backbone=dict(type='TimmBackbone', model_name='resnet50', cifar_stem=True),
    num_classes=10,
    pretrained=None,  # --cfg-options model.pretrained=CKPT
    frozen=True,
    head_norm=False,
    data_preprocessor=dict(type='ContrastiveDataPreprocessor', mean={{_base_.mean}},
                           std={{_base_.std}}),
)

train_pipeline = dict(type='ContrastiveView', size=32, scale=(0.2, 1.0), jitter_p=0.0,
                      grayscale_p=0.0, flip=True)
train_dataloader = dict(
    batch_size=512,
    drop_last=False,
    dataset=dict(pipeline=dict(_delete_=True, **train_pipeline)),
)
val_dataloader = dict(
    batch_size=512,
    num_workers=8,
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

# The backbone's weights and BN buffers are fingerprinted before training; any change fails the run.
custom_hooks = [dict(type='FrozenBackboneCheckHook')]
# Validation and test labels in the training split's class ids, matched by name (folder data sets
# number classes per split); a class the training split lacks is refused. A default hook, so
# configs that replace custom_hooks (the semi-supervised ones) keep it.
default_hooks = dict(class_match=dict(type='ClassMatchHook'))
