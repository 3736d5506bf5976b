# The debiased contrastive loss (Chuang et al., NeurIPS 2020) on SimCLR's CIFAR-100 recipe.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py']

# tau_plus: the class prior, 1/100 for 100 balanced classes (the paper's 0.01 on CIFAR-100).
model = dict(type='DebiasedCL', tau_plus=0.01)
