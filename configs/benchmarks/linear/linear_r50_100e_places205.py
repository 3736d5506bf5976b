# Linear evaluation on Places205 (transfer, paper Table 2): the ImageNet linear protocol
# (frozen ResNet-50, one FC layer, SGD lr 10, 100 epochs, x0.1 at 60 and 80) on 205 scene classes.
# Data: the official release in data/places205, i.e. the images of imagesPlaces205_resize.tar.gz
# under data/vision/torralba/deeplearning/images256/ and the split lists of
# trainvalsplit_places205.tar.gz under trainvalsplit_places205/ (despite the .csv suffix, lines
# are 'a/abbey/gsun_0003586c3eedd97457b2d729ebfe18b5.jpg 0': relative path, space, class id).
# Run: tools/dist_train.sh configs/benchmarks/linear/linear_r50_100e_places205.py 8 \
#          --cfg-options model.pretrained=CKPT
_base_ = ['./linear_r50_100e_in1k.py']

_places_images = 'data/places205/data/vision/torralba/deeplearning/images256'
# List files are read relative to data_root: from images256/ back up to data/places205/.
_places_lists = '../../../../../trainvalsplit_places205'

model = dict(num_classes=205)
train_dataloader = dict(dataset=dict(
    _delete_=True, type='ImageFolder', data_root=_places_images,
    ann_file=f'{_places_lists}/train_places205.csv', pipeline={{_base_.train_pipeline}}))
val_dataloader = dict(dataset=dict(
    _delete_=True, type='ImageFolder', data_root=_places_images,
    ann_file=f'{_places_lists}/val_places205.csv', pipeline={{_base_.eval_pipeline}}))
test_dataloader = val_dataloader
