# PCL table: PCL's choices with IFND's elimination loss instead of ProtoNCE.
_base_ = ['../pcl_r50_1000e_cifar100.py']

model = dict(type='IFND')
