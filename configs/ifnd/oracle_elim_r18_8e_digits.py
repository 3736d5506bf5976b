# The elimination oracle on digits: IFND's elimination loss (Eq. 3) with ground-truth labels.
_base_ = ['../simclr/simclr_r18_8e_digits.py']

model = dict(type='OracleElim')
