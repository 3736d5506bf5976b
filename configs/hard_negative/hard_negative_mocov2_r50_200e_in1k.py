# Hard negative sampling (Robinson et al., ICLR 2021) on MoCo v2's ImageNet recipe: the queue's
# 65536 keys are the negatives.
_base_ = ['../mocov2/mocov2_r50_200e_in1k.py']

# tau_plus: the class prior, about 1/1000 for ImageNet-1k; 0.01, the papers' choice for ImageNet.
# beta: the hardness, 1.0: harder negatives weigh more (0 gives the debiased loss).
model = dict(type='HardNegativeMoCo', tau_plus=0.01, beta=1.0)
