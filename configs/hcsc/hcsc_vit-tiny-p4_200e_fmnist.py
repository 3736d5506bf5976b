# HCSC's instance selection on Fashion-MNIST (SimCLR base, ViT-Tiny with 4-pixel patches), the
# settings of hcsc_r18_200e_fmnist.py on IFND's clustering (ifnd_vit-tiny-p4_200e_fmnist.py):
# k-means with [10, 30, 100] clusters every 5 epochs, every label used from epoch 20 on, each
# negative dropped at random with the probability that it shares the anchor's cluster, then
# eliminated.
_base_ = ['../ifnd/ifnd_vit-tiny-p4_200e_fmnist.py']

model = dict(type='HCSC')  # elimination, the preset's treatment
pseudo_label_hook = dict(_base_.pseudo_label_hook, score='pcl',
                         acceptance=dict(type='StepAcceptance', step_epoch=20, final_rate=1.0))
custom_hooks = [pseudo_label_hook, _base_.knn_hook, _base_.fn_detection_hook]
