# HCSC's instance selection on digits (the digits protocol's SimCLR recipe) on IFND's clustering
# (ifnd_r18_8e_digits.py: k-means with [10, 30, 100] clusters after every epoch, independent
# levels, not HCSC's nested k-means), every label used from epoch 1 on (HCSC's warm-up, a tenth of
# the run, before which nothing is flagged); each negative is dropped at random with the
# probability that it shares the anchor's cluster (HCSCSelection, T = 0.2), then eliminated.
# score='pcl': the round computes PCL's concentrations, HCSC's per-prototype temperatures.
_base_ = ['../ifnd/ifnd_r18_8e_digits.py']

model = dict(type='HCSC')  # elimination, the preset's treatment
pseudo_label_hook = dict(_base_.pseudo_label_hook, score='pcl',
                         acceptance=dict(type='StepAcceptance', step_epoch=1, final_rate=1.0))
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
