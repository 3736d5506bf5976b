# Hard negative sampling (Robinson et al., ICLR 2021) on SimCLR's Fashion-MNIST recipe.
_base_ = ['../simclr/simclr_r18_200e_fmnist.py', '../_base_/hard_negatives.py']

model = dict(type='HardNegativeCL', tau_plus=_base_._hard_weighting.tau_plus,
             beta=_base_._hard_weighting.beta)
