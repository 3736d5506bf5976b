# SupCon, the oracle on digits: attraction loss with ground-truth labels.
_base_ = ['../simclr/simclr_r18_8e_digits.py']

model = dict(type='SupCon')
