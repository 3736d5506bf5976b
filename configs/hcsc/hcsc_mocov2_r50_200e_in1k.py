# HCSC on ImageNet-1k, the authors' single-crop recipe (hirl-team/HCSC at cec852d: pretrain.py's
# argparse defaults and configs/single_crop_200eps_bs256.yaml): MoCo v2 base (2-layer MLP head to
# 128-d, queue 16384, m 0.999, T 0.2), batch 256, SGD lr 0.03 with a cosine schedule over 200
# epochs; hierarchical k-means with 3000, 2000 and 1000 clusters before every epoch from epoch 20 on,
# every label used; instance selection (queue keys dropped at random by their prototype probability)
# and ProtoNCE with prototype selection over the three levels. Their code's choices, each named:
# dropped logits multiplied by 0 (dropped='zeroed'), the levels' instance losses summed
# (level_loss='sum'), clustering the momentum encoder's projections (cluster_encoder='momentum'),
# 20 warm-up epochs before the first round (warmup_epochs=20). Not here: multi-crop.
# Run: tools/dist_train.sh configs/hcsc/hcsc_mocov2_r50_200e_in1k.py 8
_base_ = ['../mocov2/mocov2_r50_200e_in1k.py', '../_base_/pseudo_labels.py',
          '../_base_/fn_detection.py']

model = dict(type='HCSCMoCo', queue_len=16384, selection_temperature=0.2, dropped='zeroed',
             level_loss='sum', cluster_encoder='momentum')
param_scheduler = [dict(type='CosineAnnealingLR', T_max=200, by_epoch=True, begin=0, end=200,
                        convert_to_iter_based=True)]
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[3000, 2000, 1000], hierarchy='nested', interval=1,
    warmup_epochs=20, score='pcl', acceptance=dict(type='ConstantAcceptance', final_rate=1.0),
    pipeline=_base_.eval_pipeline, batch_size=256, num_workers=8)
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
