# HCSC whole on digits (the digits protocol's SimCLR recipe) on IFND's clustering settings
# (ifnd_r18_8e_digits.py) made HCSC's: hierarchical k-means (100, 30, 10 clusters) after every
# epoch from epoch 1 on (HCSC's warm-up, a tenth of the run), every label used, instance and
# prototype selection with the authors' code's choices, as hcsc_r18_200e_fmnist.py.
_base_ = ['../ifnd/ifnd_r18_8e_digits.py']

model = dict(type='HCSC', dropped='zeroed', level_loss='sum')
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[100, 30, 10], hierarchy='nested', warmup_epochs=1,
    score='pcl', acceptance=dict(type='ConstantAcceptance', final_rate=1.0))
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
