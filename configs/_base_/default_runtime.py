default_scope = 'ifnd'
# Resume under torch.load(weights_only=True) with mmengine's state allow-listed.
runner_type = 'SafeLoadRunner'

env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)

default_hooks = dict(
    # mmengine's RuntimeInfoHook, with the step's outputs kept on the device and copied to the
    # host every N iterations (N = the logger's interval, and at epoch ends): no per-step sync.
    runtime_info=dict(type='BufferedRuntimeInfoHook'),
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # Atomic writes: a run killed while saving keeps its previous checkpoint.
    checkpoint=dict(type='CheckpointHook', interval=10, max_keep_ckpts=3, save_last=True,
                    backend_args=dict(backend='atomic_local')),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    # Every epoch's and step's randomness from (seed, epoch or iteration, rank): a resumed run
    # draws what the uninterrupted one drew.
    reseed=dict(type='ReseedHook'),
    # Stop at a NaN/inf loss (checked at each flush of the runtime info, every iteration of it),
    # naming the first such iteration and the last finite loss.
    finite_loss=dict(type='FiniteLossHook'),
    # Each process's BN running statistics averaged at every epoch's end (DDP does not broadcast
    # them), before clustering rounds, kNN and checkpoints read them: a resumed run matches.
    sync_bn_stats=dict(type='SyncBNStatsHook'),
    # The false-negative detector's per-sample state sized by the training set, and its epoch
    # (GloFND's start, acceptance schedules); nothing for models without a detector.
    negative_detector=dict(type='NegativeDetectorHook'),
    # The run's progress for a key encoder whose momentum follows the iterations (MoCo v3's
    # cosine schedule); nothing for other models.
    momentum=dict(type='MomentumScheduleHook'),
    # A log file that cannot be written (a full disk) gives one warning, not a traceback per line.
    log_file_errors=dict(type='LogFileErrorHook'),
    # A classifier's pre-trained backbone with non-finite or collapsed features is refused before
    # linear or semi-supervised training; nothing for other models.
    pretrained_features=dict(type='PretrainedFeaturesHook'),
)

log_processor = dict(window_size=10, by_epoch=True)
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, deterministic=False)
