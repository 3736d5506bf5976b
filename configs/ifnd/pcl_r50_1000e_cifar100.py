# PCL as in the paper's PCL table (SimCLR base, CIFAR-100): ProtoNCE, step acceptance after
# epoch 100, {2500, 5000, 10000} clusters, PCL's per-cluster concentration as the confidence.
_base_ = ['../simclr/simclr_r50_1000e_cifar100.py', '../_base_/pseudo_labels.py']

model = dict(type='PCL')
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[2500, 5000, 10000], interval=20,
    acceptance=dict(type='StepAcceptance', step_epoch=100), score='pcl',
    pipeline=_base_.eval_pipeline)
custom_hooks = [pseudo_label_hook, _base_.knn_hook]
