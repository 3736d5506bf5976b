# Hard negative sampling (Robinson et al., ICLR 2021) on SimCLR's CIFAR-10 recipe.
_base_ = ['../simclr/simclr_r50_1000e_cifar10.py']

# tau_plus: the class prior, 1/10 for 10 balanced classes (the papers' 0.1 on CIFAR-10).
# beta: the hardness, 1.0: harder negatives weigh more (0 gives the debiased loss).
model = dict(type='HardNegativeCL', tau_plus=0.1, beta=1.0)
