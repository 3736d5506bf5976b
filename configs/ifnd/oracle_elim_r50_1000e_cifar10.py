# The elimination oracle: IFND's elimination loss (Eq. 3) with ground-truth labels, same recipe
# as IFND and SupCon; it shows what removing every false negative can give on this data.
_base_ = ['../simclr/simclr_r50_1000e_cifar10.py']

model = dict(type='OracleElim')
