# IFND on Fashion-MNIST with the views made on the training device: the images are held as one
# uint8 tensor there and whole batches are sampled without loader workers; kornia makes the
# MoCo v2 views in the data preprocessor (same parameters as the CPU pipeline). Needs kornia.
_base_ = ['ifnd_r18_200e_fmnist.py']

train_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(augment_on='device'))
