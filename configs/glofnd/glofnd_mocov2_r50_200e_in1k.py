# GloFND on MoCo v2's ImageNet recipe: the queue's keys above the query's learned threshold are
# eliminated (the keys' sample indices name their thresholds' anchors).
_base_ = ['../mocov2/mocov2_r50_200e_in1k.py']

# alpha 0.001: one class in a thousand. start_epoch 70 of 200 and lr 0.05: the authors' schedule
# for 200 epochs on ImageNet-100.
model = dict(detector=dict(type='GloFND', alpha=0.001, start_epoch=70, lr=0.05), treatment='elim')
