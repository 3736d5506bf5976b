# MoCo v2: ResNet-50, 2-layer MLP head to 128-d, queue of 65536, momentum 0.999, tau 0.2.
model = dict(
    type='MoCoV2',
    queue_len=65536,
    momentum=0.999,
    temperature=0.2,
    # NHWC weights and inputs: faster convolutions on GPUs, the same results on a CPU.
    # compile='auto': torch.compile where CUDA is present (the first steps take longer), not on
    # a CPU; model.backbone.compile=False turns it off.
    backbone=dict(type='TimmBackbone', model_name='resnet50', channels_last=True, compile='auto'),
    neck=dict(type='MLPNeck', hidden_dim=2048, out_dim=128, num_layers=2, with_bn=False),
    data_preprocessor=dict(type='ContrastiveDataPreprocessor'),
)
