# HCSC whole on Fashion-MNIST (SimCLR base, ViT-Tiny with 4-pixel patches), the settings of
# hcsc_r18_200e_fmnist.py on IFND's clustering (ifnd_vit-tiny-p4_200e_fmnist.py): hierarchical
# k-means (100, 30, 10 clusters) every 5 epochs from epoch 20 on, every label used, instance and
# prototype selection with the authors' code's choices.
_base_ = ['../ifnd/ifnd_vit-tiny-p4_200e_fmnist.py']

model = dict(type='HCSC', dropped='zeroed', level_loss='sum')
pseudo_label_hook = dict(
    _base_.pseudo_label_hook, num_clusters=[100, 30, 10], hierarchy='nested', warmup_epochs=20,
    score='pcl', acceptance=dict(type='ConstantAcceptance', final_rate=1.0))
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
