"""Real short Runner runs on digits: training, the hooks, resume and checkpoints (killed runs: test_faults)."""
import copy
import glob
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch
from helpers import digits_config
from mmengine.registry import init_default_scope

from ifnd.fileio import AtomicLocalBackend, mmengine_checkpoint_globals
from ifnd.registry import MODELS, RUNNERS



def _train(cfg):
    runner = RUNNERS.build(cfg)
    runner.train()
    return runner


def _loss_history(runner) -> np.ndarray:
    return np.asarray(runner.message_hub.get_scalar('train/loss').data[0])


def _scalars(work_dir: str) -> list[dict]:
    (path,) = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_simclr_training_lowers_the_loss(tmp_path):
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path), dict(type='SimCLR', temperature=0.5), max_epochs=3)
    cfg.optim_wrapper.optimizer.lr = 0.1
    runner = _train(cfg)
    per_epoch = _loss_history(runner).reshape(3, -1).mean(axis=1)
    assert per_epoch[-1] < per_epoch[0] - 0.05, per_epoch
    assert runner.epoch == 3 and osp.isfile(tmp_path / 'epoch_3.pth')


def test_moco_training_lowers_the_loss(tmp_path):
    """MoCo's logged loss first rises as real keys replace the random queue, so compare the
    encoders before and after training on the same batches against the same (final) queue."""
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path), dict(type='MoCoV2', temperature=0.2, queue_len=256,
                                            momentum=0.9), max_epochs=3)
    cfg.optim_wrapper.optimizer.lr = 0.1
    runner = RUNNERS.build(cfg)
    model = runner.model
    initial = copy.deepcopy(model.state_dict())
    runner.train()
    trained = copy.deepcopy(model.state_dict())
    queue = {k: v for k, v in trained.items() if k.startswith('queue')}
    batches = [batch for batch, _ in zip(runner.train_dataloader, range(4))]

    def fixed_queue_loss(weights: dict) -> float:
        losses = []
        for batch in batches:
            model.load_state_dict({**weights, **queue})
            torch.manual_seed(0)  # the same key shuffle for both encoders
            with torch.no_grad():
                losses.append(model(**model.data_preprocessor(batch, True), mode='loss')['loss'].item())
        return float(np.mean(losses))

    before, after = fixed_queue_loss(initial), fixed_queue_loss(trained)
    assert after < before - 0.1, (before, after)


def test_ifnd_hooks_log_and_save(tmp_path):
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path), dict(type='IFND', temperature=0.5),
                        max_epochs=2, knn=True, fn_detection=True,
                        pseudo_labels=dict(num_clusters=[10, 30], interval=1,
                                           kmeans=dict(nredo=1, niter=10)))
    runner = _train(cfg)
    scalars = _scalars(str(tmp_path))
    keys = set().union(*scalars)
    for level in ('k10', 'k30'):
        for name in ('accept_rate', 'clusters_used', 'size_min', 'size_median', 'size_max', 'nmi',
                     'ami', 'ari', 'mtpr', 'mtnr'):
            assert f'ifnd/{level}/{name}' in keys
    assert {'ifnd/rate', 'ifnd/seconds_extract', 'ifnd/seconds_kmeans', 'ifnd/seconds_confidence',
            'knn/top1'} <= keys
    rates = [s['ifnd/rate'] for s in scalars if 'ifnd/rate' in s]
    assert rates == [0.0, 0.5, 1.0]  # before training, then after each of the two epochs
    knn = [s['knn/top1'] for s in scalars if 'knn/top1' in s]
    assert len(knn) == 3 and all(10 < v <= 100 for v in knn)
    # Each round is saved; the bank holds the last round's labels.
    saved = np.load(tmp_path / 'pseudo_labels' / 'epoch_0001.npz')
    assert saved['labels'].shape == (2, 1347)
    bank = runner.model.label_bank.labels.cpu().numpy()
    last = np.load(tmp_path / 'pseudo_labels' / 'epoch_0002.npz')['labels']
    np.testing.assert_array_equal(bank, last)
    assert (last >= 0).all(), 'rate 1.0 accepts every sample'
    half = saved['labels']
    assert ((half >= 0).sum(axis=1) == np.ceil(0.5 * 1347)).all()
    rounds = json.load(open(tmp_path / 'pseudo_labels' / 'rounds.json'))
    assert [r['epoch'] for r in rounds] == [0, 1, 2]
    assert all(r['seconds_extract'] > 0 for r in rounds)
    # Instance learning at the start: MTPR 0, MTNR 100.
    assert rounds[0]['levels'][0]['mtpr'] == 0 and rounds[0]['levels'][0]['mtnr'] == 100
    # The negatives the loss eliminated, per epoch: none in the first (nothing accepted), then
    # with the labels of the round after it, per level and averaged over the levels.
    first, second = [s for s in scalars if 'train/fn_recall' in s]
    assert first['step'] == 1 and first['train/fn_recall'] == 0 and 'train/fn_precision' not in first
    assert second['step'] == 2 and 0 < second['train/fn_recall'] < 100
    for key in ('fn_precision', 'fn_recall'):
        levels = [second[f'train/{key}/{level}'] for level in ('k10', 'k30')]
        assert second[f'train/{key}'] == pytest.approx(np.mean(levels))


def test_resume_restores_epoch_optimizer_queue_and_labels(tmp_path):
    torch.manual_seed(0)
    model = dict(type='IFNDMoCo', temperature=0.2, queue_len=256, momentum=0.99)
    pseudo = dict(num_clusters=[10], interval=1, kmeans=dict(nredo=1, niter=10))
    first = _train(digits_config(str(tmp_path), model, max_epochs=2, pseudo_labels=pseudo))
    saved_queue = first.model.queue.clone()
    saved_index = first.model.queue_index.clone()
    saved_labels = first.model.label_bank.labels.clone()
    saved_momentum = {k: v['momentum_buffer'].clone()
                      for k, v in first.optim_wrapper.optimizer.state_dict()['state'].items()}
    assert (saved_index >= 0).all() and (saved_labels >= 0).any()

    cfg = digits_config(str(tmp_path), model, max_epochs=2, pseudo_labels=pseudo, resume=True)
    second = RUNNERS.build(cfg)
    second.load_or_resume()
    assert second.epoch == 2 and second.iter == first.iter
    torch.testing.assert_close(second.model.queue, saved_queue, rtol=0, atol=0)
    torch.testing.assert_close(second.model.queue_index, saved_index, rtol=0, atol=0)
    torch.testing.assert_close(second.model.label_bank.labels, saved_labels, rtol=0, atol=0)
    state = second.optim_wrapper.optimizer.state_dict()['state']
    for key, buf in saved_momentum.items():
        torch.testing.assert_close(state[key]['momentum_buffer'], buf, rtol=0, atol=0)


def test_atomic_backend_keeps_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    target = tmp_path / 'ckpt.pth'
    backend = AtomicLocalBackend()
    backend.put(b'old', target)

    def broken_replace(src, dst):
        raise OSError('disk full')

    monkeypatch.setattr(os, 'replace', broken_replace)
    with pytest.raises(OSError, match='disk full'):
        backend.put(b'new contents', target)
    assert target.read_bytes() == b'old'
    assert os.listdir(tmp_path) == ['ckpt.pth'], 'the temp file is removed'


def test_checkpoint_allow_list_refuses_code(tmp_path):
    """Checkpoints load with weights_only=True; a pickled call is still refused."""

    class Exploit:
        def __reduce__(self):
            return (os.system, ('echo hacked',))

    path = tmp_path / 'evil.pth'
    torch.save({'meta': Exploit()}, path)
    with torch.serialization.safe_globals(mmengine_checkpoint_globals()):
        with pytest.raises(Exception, match='system'):
            torch.load(path, weights_only=True)


def _tiny_pair(**extra):
    init_default_scope('ifnd')
    from helpers import TINY_BACKBONE, TINY_NECK
    torch.manual_seed(0)
    simclr = MODELS.build(dict(type='SimCLR', temperature=0.5, backbone=TINY_BACKBONE, neck=TINY_NECK))
    ifnd = MODELS.build(dict(type='IFND', temperature=0.5, backbone=TINY_BACKBONE, neck=TINY_NECK, **extra))
    ifnd.load_state_dict(simclr.state_dict(), strict=False)
    return simclr, ifnd


@pytest.mark.parametrize('treatment', ['elim', 'attr'])
def test_ifnd_with_acceptance_zero_equals_simclr(treatment):
    simclr, ifnd = _tiny_pair(treatment=treatment)
    ifnd.label_bank.reset(num_levels=3, num_samples=100)  # nothing accepted: unique labels
    views = [torch.rand(16, 3, 16, 16), torch.rand(16, 3, 16, 16)]
    samples = {'index': torch.randperm(100)[:16], 'label': torch.zeros(16, dtype=torch.long)}
    loss_a = simclr.loss(views, samples)['loss']
    loss_b = ifnd.loss(views, samples)['loss']
    loss_a.backward()
    loss_b.backward()
    assert loss_a.item() == loss_b.item()
    for (name, pa), (_, pb) in zip(simclr.named_parameters(), ifnd.named_parameters()):
        assert torch.equal(pa.grad, pb.grad), name


def test_ifnd_labels_change_the_loss():
    _, ifnd = _tiny_pair(treatment='elim')
    ifnd.label_bank.reset(1, 16)
    views = [torch.rand(16, 3, 16, 16), torch.rand(16, 3, 16, 16)]
    samples = {'index': torch.arange(16), 'label': torch.zeros(16, dtype=torch.long)}
    inst = ifnd.loss(views, samples)['loss'].item()
    ifnd.label_bank.update(torch.zeros(1, 16, dtype=torch.long))  # every sample in one cluster
    out = ifnd.loss(views, samples)
    assert out['loss'].item() < inst and out['accepted'].item() == 1.0


def test_label_bank_needs_the_hook():
    _, ifnd = _tiny_pair()
    with pytest.raises(RuntimeError, match='PseudoLabelHook'):
        ifnd.loss([torch.rand(4, 3, 16, 16)] * 2, {'index': torch.arange(4)})


def test_pcl_trains_with_prototypes_and_its_concentration(tmp_path):
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path), dict(type='PCL', temperature=0.5), max_epochs=1,
                        pseudo_labels=dict(num_clusters=[10, 20],
                                           acceptance=dict(type='ConstantAcceptance'),
                                           score='pcl', kmeans=dict(nredo=1, niter=10)))
    runner = _train(cfg)
    proto = np.asarray(runner.message_hub.get_scalar('train/loss_proto').data[0])
    assert (proto > 0).all(), 'the prototype term is active from the first (constant) round'
    bank = runner.model.label_bank
    assert bank.num_clusters.tolist() == [10, 20]
    assert bank.centroids.shape == (2, 20, 32) and (bank.concentration[0, :10] > 0).all()
    rounds = json.load(open(tmp_path / 'pseudo_labels' / 'rounds.json'))
    assert rounds[0]['levels'][0]['accept_rate'] == 1.0
