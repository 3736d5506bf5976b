# The debiased contrastive loss (Chuang et al., NeurIPS 2020) on SimCLR's CIFAR-10 recipe.
_base_ = ['../simclr/simclr_r50_1000e_cifar10.py']

# tau_plus: the class prior, 1/10 for 10 balanced classes (the paper's 0.1 on CIFAR-10).
model = dict(type='DebiasedCL', tau_plus=0.1)
