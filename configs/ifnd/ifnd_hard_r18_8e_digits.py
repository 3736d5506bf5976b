# IFND's detection on digits with hard negative weighting of the negatives it keeps.
_base_ = ['./ifnd_r18_8e_digits.py', '../_base_/hard_negatives.py']

model = dict(type='SimCLR', detector=dict(type='PseudoLabels'), treatment='elim',
             weighting=_base_._hard_weighting)
