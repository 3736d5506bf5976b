# PCL table: IFND's choices with PCL's ProtoNCE objective.
_base_ = ['../ifnd_r50_1000e_cifar100.py']

model = dict(type='PCL')
