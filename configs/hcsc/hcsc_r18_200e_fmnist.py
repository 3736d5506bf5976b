# HCSC whole on Fashion-MNIST (SimCLR base, ResNet-18) on IFND's clustering settings
# (ifnd_r18_200e_fmnist.py) made HCSC's: hierarchical k-means, 100 clusters of the samples, 30 of
# those centroids, 10 of those, every 5 epochs from epoch 20 on (HCSC's warm-up, 20 of 200 epochs),
# every label used; instance selection (each negative dropped at random with the probability that
# it shares the anchor's cluster, T = 0.2) and ProtoNCE with prototype selection over the three
# levels, with the authors' code's choices: dropped logits multiplied by 0, the levels' instance
# losses summed (the options and ours beside them: docs/methods.md).
_base_ = ['../ifnd/ifnd_r18_200e_fmnist.py']

model = dict(type='HCSC', dropped='zeroed', level_loss='sum')
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[100, 30, 10], hierarchy='nested', warmup_epochs=20,
    score='pcl', acceptance=dict(type='ConstantAcceptance', final_rate=1.0))
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
