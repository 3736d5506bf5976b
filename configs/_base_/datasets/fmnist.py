# Fashion-MNIST from Debian's dataset-fashion-mnist (IDX files), 28x28 grey images as RGB.
data_root = '/usr/share/datasets/fashion-mnist'
view = dict(type='MoCoV2View', size=28)
eval_pipeline = dict(type='EvalView', size=28)
mean = (0.2860, 0.2860, 0.2860)
std = (0.3530, 0.3530, 0.3530)

train_dataloader = dict(
    batch_size=256,
    num_workers=2,
    persistent_workers=True,
    drop_last=True,
    sampler=dict(type='SeededSampler', shuffle=True),  # per-sample augmentation seeds: exact resume
    collate_fn=dict(type='ifnd.batch_collate'),  # default_collate, or a whole batch from __getitems__
    dataset=dict(type='FashionMNIST', data_root=data_root, split='train',
                 pipeline=dict(type='MultiView', num_views=2, transforms=view),
                 augment_on='cpu'),  # 'device': views made in batches in the data preprocessor
)
val_dataset = dict(type='FashionMNIST', data_root=data_root, split='test', pipeline=eval_pipeline)

# Online weighted kNN on the validation split (the memory bank: training images, eval transform).
knn_hook = dict(type='KNNEvalHook', val_dataset=val_dataset, pipeline=eval_pipeline, interval=10)
custom_hooks = [knn_hook]
