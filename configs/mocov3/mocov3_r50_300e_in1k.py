# MoCo v3, ResNet-50 on ImageNet-1k, 300 epochs: the 100-epoch recipe with lr 0.3 x batch/256
# (CONFIG.md of facebookresearch/moco-v3 at c349e6e2: `--lr=.3 --epochs=300`).
_base_ = ['mocov3_r50_100e_in1k.py']
optim_wrapper = dict(optimizer=dict(lr=0.3))
train_cfg = dict(max_epochs=300)
