# IFND's detection (pseudo labels, linear acceptance) with hard negative weighting of the
# negatives it keeps: does IFND's elimination add to Robinson et al.'s reweighting?
_base_ = ['./ifnd_r18_200e_fmnist.py']

# tau_plus and beta: the hard-negative config's (configs/hard_negative/).
model = dict(type='SimCLR', detector=dict(type='PseudoLabels'), treatment='elim',
             weighting=dict(type='hard', tau_plus=0.1, beta=1.0))
