# IFND with confident labels (./ifnd_confident_r18_200e_fmnist.py) and hard negative weighting of the
# negatives it keeps: evidence-accepted detection beside the best label-free weighting.
_base_ = ['./ifnd_confident_r18_200e_fmnist.py', '../_base_/hard_negatives.py']

model = dict(weighting=_base_._hard_weighting)
