# SimCLR with ResNet-50 and the paper's 3-layer MLP head to 128-d.
model = dict(
    type='SimCLR',
    temperature=0.5,
    backbone=dict(type='TimmBackbone', model_name='resnet50'),
    neck=dict(type='MLPNeck', hidden_dim=2048, out_dim=128, num_layers=3),
    data_preprocessor=dict(type='ContrastiveDataPreprocessor'),
)
