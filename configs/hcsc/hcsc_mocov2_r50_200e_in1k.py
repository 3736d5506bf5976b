# HCSC's single-crop ImageNet recipe (the authors' configs/single_crop_200eps_bs256.yaml): MoCo v2
# base (2-layer MLP head to 128-d, queue 16384, m 0.999, T 0.2), SGD lr 0.03 at batch 256 with a
# cosine schedule over 200 epochs, k-means with 3000, 2000 and 1000 clusters each epoch from
# epoch 20 on (the warm-up); each queue key is dropped at random with the probability that it
# shares the query's cluster (HCSCSelection, T = 0.2, PCL's concentrations), then eliminated.
# Not here: HCSC's prototype selection and ProtoNCE term, its nested (hierarchical) k-means and
# multi-crop; the levels are clustered independently.
# Run: tools/dist_train.sh configs/hcsc/hcsc_mocov2_r50_200e_in1k.py 8
_base_ = ['../mocov2/mocov2_r50_200e_in1k.py', '../_base_/pseudo_labels.py',
          '../_base_/fn_detection.py']

model = dict(type='HCSCMoCo', queue_len=16384, selection_temperature=0.2)
param_scheduler = [dict(type='CosineAnnealingLR', T_max=200, by_epoch=True, begin=0, end=200,
                        convert_to_iter_based=True)]
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[3000, 2000, 1000], interval=1, score='pcl',
    acceptance=dict(type='StepAcceptance', step_epoch=20, final_rate=1.0),
    pipeline=_base_.eval_pipeline, batch_size=256, num_workers=8)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
