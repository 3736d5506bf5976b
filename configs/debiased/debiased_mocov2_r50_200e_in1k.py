# The debiased contrastive loss (Chuang et al., NeurIPS 2020) on MoCo v2's ImageNet recipe: the
# queue's 65536 keys are the negatives.
_base_ = ['../mocov2/mocov2_r50_200e_in1k.py']

# tau_plus: the class prior, about 1/1000 for ImageNet-1k; 0.01, the papers' choice for ImageNet.
model = dict(type='DebiasedMoCo', tau_plus=0.01)
