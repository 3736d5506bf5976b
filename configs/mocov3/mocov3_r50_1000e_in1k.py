# MoCo v3, ResNet-50 on ImageNet-1k, 1000 epochs: lr 0.3 x batch/256, wd 1.5e-6, m0 = 0.996
# (CONFIG.md of facebookresearch/moco-v3 at c349e6e2: `--lr=.3 --wd=1.5e-6 --epochs=1000
# --moco-m=0.996`).
_base_ = ['mocov3_r50_300e_in1k.py']
model = dict(momentum=0.996)
optim_wrapper = dict(optimizer=dict(weight_decay=1.5e-6))
train_cfg = dict(max_epochs=1000)
