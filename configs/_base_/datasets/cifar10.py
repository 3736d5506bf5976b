# CIFAR-10 in torchvision's on-disk format (data/cifar10/cifar-10-batches-py).
data_root = 'data/cifar10'
view = dict(type='MoCoV2View', size=32)  # SupContrast's CIFAR recipe: no blur
eval_pipeline = dict(type='EvalView', size=32)
mean = (0.4914, 0.4822, 0.4465)
std = (0.2470, 0.2435, 0.2616)

train_dataloader = dict(
    batch_size=128,  # per GPU: 8 GPUs x 128 = 1024
    num_workers=8,
    persistent_workers=True,
    drop_last=True,
    sampler=dict(type='SeededSampler', shuffle=True),  # per-sample augmentation seeds: exact resume
    collate_fn=dict(type='ifnd.batch_collate'),  # default_collate, or a whole batch from __getitems__
    dataset=dict(type='CIFAR10', data_root=data_root, split='train',
                 pipeline=dict(type='MultiView', num_views=2, transforms=view),
                 augment_on='cpu'),  # 'device': views made in batches in the data preprocessor
)
val_dataset = dict(type='CIFAR10', data_root=data_root, split='test', pipeline=eval_pipeline)

# Online weighted kNN on the validation split (the memory bank: training images, eval transform).
knn_hook = dict(type='KNNEvalHook', val_dataset=val_dataset, pipeline=eval_pipeline, interval=10)
custom_hooks = [knn_hook]
