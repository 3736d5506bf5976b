# GloFND's detection with hard negative weighting of the negatives it keeps (elimination of the
# flagged ones, then Robinson et al.'s reweighting of the rest).
_base_ = ['./glofnd_r18_200e_fmnist.py']

# tau_plus and beta: the hard-negative config's (configs/hard_negative/).
model = dict(weighting=dict(type='hard', tau_plus=0.1, beta=1.0))
