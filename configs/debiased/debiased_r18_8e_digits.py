# The debiased contrastive loss (Chuang et al., NeurIPS 2020) on digits.
_base_ = ['../simclr/simclr_r18_8e_digits.py']

# tau_plus: the class prior, 1/10 for 10 balanced classes (the paper's 0.1 on CIFAR-10).
model = dict(type='DebiasedCL', tau_plus=0.1)
