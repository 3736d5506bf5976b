# The elimination oracle on IFND's digits schedule: ground-truth classes, accepted for a random
# share r = epoch / max_epochs of the images, updated at IFND's clustering interval.
_base_ = ['./ifnd_r18_8e_digits.py']

# seed: which images are accepted first (the benchmark sets the run's seed).
model = dict(type='SimCLR', treatment='elim', detector=dict(
    type='GroundTruth', acceptance=dict(type='LinearAcceptance', final_rate=1.0,
                                        interval=_base_.pseudo_label_hook.interval, seed=0)))
custom_hooks = [_base_.knn_hook, _base_.fn_detection_hook]
