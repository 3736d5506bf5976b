# Linear evaluation on ImageNet-1k (paper App. A, the MoCo v2 / PCL protocol): a frozen ResNet-50
# in eval mode (fixed BN statistics) and one fully connected layer trained for 100 epochs, SGD
# lr 10, momentum 0.9, weight decay 0, batch 256 (8 GPUs x 32); lr x0.1 at 60 and 80 (MoCo's
# linear-classification schedule, which the paper does not restate).
# Train: RandomResizedCrop(224, scale 0.08-1) + flip; eval: resize 256, centre crop 224.
# Run: tools/dist_train.sh configs/benchmarks/linear/linear_r50_100e_in1k.py 8 \
#          --cfg-options model.pretrained=work_dirs/ifnd_r50_200e_in1k/epoch_200.pth
_base_ = ['../../_base_/datasets/imagenet.py', '../../_base_/default_runtime.py']

model = dict(
    type='ImageClassifier',
    # Must match the pre-training config's backbone; the loader refuses mismatched weights.
    backbone=dict(type='TimmBackbone', model_name='resnet50'),
    num_classes=1000,
    pretrained=None,  # --cfg-options model.pretrained=CKPT
    frozen=True,
    head_norm=False,  # a plain FC layer, as the paper; lr 10 is calibrated for it
    data_preprocessor=dict(type='ContrastiveDataPreprocessor'),
)

train_pipeline = dict(type='ContrastiveView', size=224, scale=(0.08, 1.0), jitter_p=0.0,
                      grayscale_p=0.0, flip=True)
train_dataloader = dict(
    drop_last=False,
    dataset=dict(pipeline=dict(_delete_=True, **train_pipeline)),
)
val_dataloader = dict(
    batch_size=32,
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
                     optimizer=dict(type='SGD', lr=10.0, momentum=0.9, weight_decay=0.0))
param_scheduler = [dict(type='MultiStepLR', by_epoch=True, milestones=[60, 80], gamma=0.1)]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=100, val_interval=10)
auto_scale_lr = dict(base_batch_size=256, enable=False)

# The backbone's weights and BN buffers are fingerprinted before training; any change fails the run.
custom_hooks = [dict(type='FrozenBackboneCheckHook')]
# Validation and test labels in the training split's class ids, matched by name (folder data sets
# number classes per split); a class the training split lacks is refused. A default hook, so
# configs that replace custom_hooks (the semi-supervised ones) keep it.
default_hooks = dict(class_match=dict(type='ClassMatchHook'))
