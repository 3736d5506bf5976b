# IFND on ImageNet-1k (the paper's main setting): MoCo v2 base, 3-layer MLP head, k-means with
# {1000, 3000, 10000} clusters after every epoch, linear acceptance 0 -> 100%, elimination loss;
# each epoch logs the precision and recall of the queued keys its pseudo labels flag.
# Run: tools/dist_train.sh configs/ifnd_r50_200e_in1k.py 8
_base_ = ['mocov2/mocov2_r50_200e_in1k.py', '_base_/pseudo_labels.py', '_base_/fn_detection.py']

model = dict(
    type='IFNDMoCo',
    neck=dict(num_layers=3, with_bn=True),
)
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[1000, 3000, 10000], interval=1,
    pipeline=_base_.eval_pipeline, batch_size=256, num_workers=8)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
