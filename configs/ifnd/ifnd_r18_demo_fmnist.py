# The `make demo` run: IFND at the CPU-demo budget of configs/simclr/simclr_r18_demo_fmnist.py,
# k-means with [10, 30, 100] clusters every 2 epochs, linear acceptance 0 -> 100%.
_base_ = ['../simclr/simclr_r18_demo_fmnist.py', '../_base_/pseudo_labels.py',
          '../_base_/fn_detection.py']

model = dict(type='IFND')
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[10, 30, 100], interval=2,
    pipeline=_base_.eval_pipeline,
    kmeans=dict(_base_.pseudo_label_hook.kmeans, nredo=2))  # fewer restarts: the demo's budget
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
