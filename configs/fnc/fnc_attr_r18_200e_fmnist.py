# FNC by attraction on Fashion-MNIST: the detected false negatives join the positives (SupCon form).
_base_ = ['fnc_elim_r18_200e_fmnist.py']

model = dict(treatment='attr')
