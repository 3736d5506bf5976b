# GloFND's detection with hard negative weighting of the negatives it keeps (elimination of the
# flagged ones, then Robinson et al.'s reweighting of the rest).
_base_ = ['./glofnd_r18_200e_fmnist.py', '../_base_/hard_negatives.py']

model = dict(weighting=_base_._hard_weighting)
