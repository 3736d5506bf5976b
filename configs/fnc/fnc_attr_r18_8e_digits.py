# FNC by attraction on digits: the detected false negatives join the positives (SupCon form).
_base_ = ['fnc_elim_r18_8e_digits.py']

model = dict(treatment='attr')
