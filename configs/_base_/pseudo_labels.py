# IFND's pseudo-label hook with the paper's settings: κ-confidence (Eq. 2) of the normalised
# projection z as the score, linear acceptance 0 -> 100%, and PCL's k-means settings (20 iterations, 5 restarts,
# at most 1000 / at least 10 points per centroid). A leaf config adds what its data set needs:
#   pseudo_label_hook = dict(_base_.pseudo_label_hook, num_clusters=[10, 30, 100], interval=5,
#                            pipeline=_base_.eval_pipeline)
#   custom_hooks = [pseudo_label_hook, _base_.knn_hook]
pseudo_label_hook = dict(
    type='PseudoLabelHook',
    acceptance=dict(type='LinearAcceptance', final_rate=1.0),
    feature='z',
    score='kappa',
    kmeans=dict(niter=20, nredo=5, max_points_per_centroid=1000, min_points_per_centroid=10),
)
