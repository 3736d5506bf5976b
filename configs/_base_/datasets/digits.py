# scikit-learn's bundled 8x8 digits, upscaled to 16 pixels: a data set that is always there.
view = dict(type='ContrastiveView', size=16, scale=(0.5, 1.0), flip=False)
eval_pipeline = dict(type='EvalView', size=16)



train_dataloader = dict(
    batch_size=64,
    num_workers=0,
    drop_last=True,
    sampler=dict(type='SeededSampler', shuffle=True),  # per-sample augmentation seeds: exact resume
    collate_fn=dict(type='ifnd.batch_collate'),  # default_collate, or a whole batch from __getitems__
    dataset=dict(type='Digits', split='train',
                 pipeline=dict(type='MultiView', num_views=2, transforms=view),
                 augment_on='cpu'),  # 'device': views made in batches in the data preprocessor
)
val_dataset = dict(type='Digits', split='test', pipeline=eval_pipeline)

# Online weighted kNN on the validation split (the memory bank: training images, eval transform).
knn_hook = dict(type='KNNEvalHook', val_dataset=val_dataset, pipeline=eval_pipeline, interval=10)
custom_hooks = [knn_hook]
mean = (0.2, 0.2, 0.2)
std = (0.3, 0.3, 0.3)
