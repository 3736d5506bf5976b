# IFND with nested levels on the recipe of ifnd_r18_8e_digits.py: HCSC's hierarchical k-means, 100 clusters
# of the samples, 30 of those centroids, 10 of those, each sample's label composed through the
# parent clusters; κ, acceptance and elimination as IFND's.
_base_ = ['ifnd_r18_8e_digits.py']

pseudo_label_hook = dict(_base_.pseudo_label_hook, num_clusters=[100, 30, 10], hierarchy='nested')
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
