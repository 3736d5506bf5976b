# IFND on Fashion-MNIST with the views made on the training device: the images are held as one
# uint8 tensor there and whole batches are sampled without loader workers; the data preprocessor
# makes the MoCo v2 views in batches (same parameters as the CPU pipeline), with no host sync.
# Where CUDA is present the step runs in bfloat16 autocast with a compiled, channels_last
# encoder; on a CPU in float32, uncompiled (optim_wrapper.type=OptimWrapper and
# model.backbone.compile=False turn them off on a GPU too).
_base_ = ['ifnd_r18_200e_fmnist.py']

train_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(augment_on='device'))
model = dict(backbone=dict(channels_last=True, compile='auto'))
optim_wrapper = dict(type='AutoAmpOptimWrapper')
