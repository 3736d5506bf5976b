# FNC by attraction on CIFAR-100: the detected false negatives join the positives (SupCon form).
_base_ = ['fnc_elim_r50_1000e_cifar100.py']

model = dict(treatment='attr')
