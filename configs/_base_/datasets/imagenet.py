# ImageNet-1k in its folder layout (data/imagenet/{train,val}/<wnid>/*.JPEG).
data_root = 'data/imagenet'
view = dict(type='MoCoV2View', size=224)
eval_pipeline = dict(type='EvalView', size=224)

train_dataloader = dict(
    batch_size=32,  # per GPU: 8 GPUs x 32 = 256
    num_workers=8,
    persistent_workers=True,
    drop_last=True,
    sampler=dict(type='SeededSampler', shuffle=True),  # per-sample augmentation seeds: exact resume
    collate_fn=dict(type='ifnd.batch_collate'),  # default_collate, or a whole batch from __getitems__
    dataset=dict(type='ImageNet', data_root=data_root, split='train',
                 pipeline=dict(type='MultiView', num_views=2, transforms=view),
                 augment_on='cpu'),  # 'device': views made in batches in the data preprocessor
)
val_dataset = dict(type='ImageNet', data_root=data_root, split='val', pipeline=eval_pipeline)

# Online weighted kNN on the validation split (the memory bank: training images, eval transform).
knn_hook = dict(type='KNNEvalHook', val_dataset=val_dataset, pipeline=eval_pipeline, interval=10)
custom_hooks = [knn_hook]
