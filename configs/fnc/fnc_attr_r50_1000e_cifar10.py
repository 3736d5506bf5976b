# FNC by attraction on CIFAR-10: the detected false negatives join the positives (SupCon form).
_base_ = ['fnc_elim_r50_1000e_cifar10.py']

model = dict(treatment='attr')
