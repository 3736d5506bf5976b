# Hard negative sampling (Robinson et al., ICLR 2021) on SimCLR's CIFAR-100 recipe.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py']

# tau_plus: the class prior, 1/100 for 100 balanced classes (the papers' 0.01 on CIFAR-100).
# beta: the hardness, 1.0: harder negatives weigh more (0 gives the debiased loss).
model = dict(type='HardNegativeCL', tau_plus=0.01, beta=1.0)
