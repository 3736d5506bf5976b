# SimCLR with ResNet-50 and the paper's 3-layer MLP head to 128-d.
model = dict(
    type='SimCLR',
    temperature=0.5,
    # NHWC weights and inputs: faster convolutions on GPUs, the same results on a CPU.
    # compile='auto': torch.compile where CUDA is present (the first steps take longer), not on
    # a CPU; model.backbone.compile=False turns it off.
    backbone=dict(type='TimmBackbone', model_name='resnet50', channels_last=True, compile='auto'),
    neck=dict(type='MLPNeck', hidden_dim=2048, out_dim=128, num_layers=3),
    data_preprocessor=dict(type='ContrastiveDataPreprocessor'),
)
