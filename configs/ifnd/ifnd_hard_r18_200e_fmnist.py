# IFND's detection (pseudo labels, linear acceptance) with hard negative weighting of the
# negatives it keeps: does IFND's elimination add to Robinson et al.'s reweighting?
_base_ = ['./ifnd_r18_200e_fmnist.py', '../_base_/hard_negatives.py']

model = dict(type='SimCLR', detector=dict(type='PseudoLabels'), treatment='elim',
             weighting=_base_._hard_weighting)
