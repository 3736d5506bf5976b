# Precision and recall (%) of the negatives a method flags as false negatives, against the batch's
# ground-truth classes, once per epoch (train/fn_precision, train/fn_recall). A leaf config
# appends it to its custom_hooks, last, so the indices of the other hooks stay as they were:
#   custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
fn_detection_hook = dict(type='FalseNegativeDetectionHook')
