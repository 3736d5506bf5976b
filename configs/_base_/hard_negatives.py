# Hard negative weighting (Robinson et al., ICLR 2021) with the paper's values: tau_plus, the class
# prior, 1/10 for 10 balanced classes (the paper's 0.1 on CIFAR-10), and beta, the hardness, 1.0
# (0 gives the debiased loss). HardNegativeCL takes them as its own arguments, a combination as
# the weighting of the negatives its detector keeps:
#   model = dict(type='HardNegativeCL', tau_plus=_base_._hard_weighting.tau_plus,
#                beta=_base_._hard_weighting.beta)
#   model = dict(type='SimCLR', detector=..., treatment='elim', weighting=_base_._hard_weighting)
_hard_weighting = dict(type='hard', tau_plus=0.1, beta=1.0)
