"""The zoo's caches with links planted in them, and the hosts a Hub download contacts: nothing
outside the cache is deleted, moved or written, and no host but the source's is contacted."""
import hashlib
import os
import os.path as osp

import pytest
from test_zoo import REVISION, peer_files, zoo_env  # noqa: F401 (fixtures)

from ifnd import zoo


def _outside(tmp_path):
    """A file outside the cache that a planted link points at: it must stay as it is."""
    victim = tmp_path / 'outside' / 'victim.pth'
    victim.parent.mkdir()
    victim.write_bytes(b'keep me')
    return victim


def _plant(link: str, target) -> None:
    os.makedirs(osp.dirname(link), exist_ok=True)
    os.symlink(target, link)


@pytest.mark.parametrize('where', ['snapshot', 'blob', 'blobs-folder', 'hub-cache'])
def test_a_link_out_of_the_hub_cache_is_refused_and_its_target_kept(peer_files, zoo_env, tmp_path, where):
    _, files = peer_files
    _, publish = zoo_env
    publish(files['moco'], 'wrong_sha256')  # a checksum mismatch deletes the download: never the target
    victim = _outside(tmp_path)
    hub = osp.join(zoo.cache_dir(), '.hub')
    repo = osp.join(hub, 'models--lab--baselines')
    etag = hashlib.sha256(files['moco']).hexdigest()  # the test server's ETag
    link = {'snapshot': osp.join(repo, 'snapshots', REVISION, 'peer.pth.tar'),
            'blob': osp.join(repo, 'blobs', etag),
            'blobs-folder': osp.join(repo, 'blobs'), 'hub-cache': hub}[where]
    target = victim if where in ('snapshot', 'blob') else victim.parent
    _plant(link, target)
    with pytest.raises(SystemExit) as err:
        zoo.main(['download', 'peer'])
    message = str(err.value)
    assert message.startswith(f'{link} is a link to {osp.realpath(target)}, outside the cache')
    assert f'rm {link} removes the link' in message and '\n' not in message
    assert victim.read_bytes() == b'keep me' and os.listdir(victim.parent) == ['victim.pth']
    assert osp.islink(link)


@pytest.mark.parametrize('planted', ['peer.pth.tar.part', 'peer.pth.tar', 'peer.pth.tar.verified.json'])
def test_a_link_out_of_the_local_cache_is_refused_and_its_target_kept(peer_files, zoo_env, tmp_path, planted):
    _, files = peer_files
    server, publish = zoo_env
    publish(files['moco'], 'md5_prefix', hub=False)
    victim = _outside(tmp_path)
    link = osp.join(zoo.cache_dir(), planted)
    _plant(link, victim)
    with pytest.raises(SystemExit, match=f'{link} is a link to .*, outside the cache'):
        zoo.main(['download', 'peer'])
    assert victim.read_bytes() == b'keep me' and osp.islink(link) and server.requests == []


@pytest.mark.parametrize('cached', [False, True], ids=['download', 'in-hub-cache'])
def test_a_hub_download_contacts_only_its_endpoint(peer_files, zoo_env, tmp_path, monkeypatch, cached):
    import httpx2
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import _detect_agent
    _, files = peer_files
    _, publish = zoo_env
    publish(files['moco'], 'sha256')
    endpoint = os.environ['HF_ENDPOINT']
    if cached:  # the file already in huggingface_hub's cache, as an interrupted download leaves it
        monkeypatch.setattr(constants, 'HF_HUB_DISABLE_TELEMETRY', True)
        huggingface_hub.hf_hub_download('lab/baselines', 'peer.pth.tar', revision=REVISION, endpoint=endpoint,
                                        cache_dir=osp.join(zoo.cache_dir(), '.hub'))
    # The library's defaults: telemetry on, its registry not fetched yet in this process.
    monkeypatch.setattr(constants, 'HF_HUB_DISABLE_TELEMETRY', False)
    monkeypatch.setattr(constants, 'AGENT_HARNESSES_PATH', str(tmp_path / 'registry.json'))
    monkeypatch.setattr(_detect_agent, '_registry', None)
    contacted = []
    send = httpx2.Client.send

    def recording_send(self, request, **kwargs):
        contacted.append(str(request.url))
        if not str(request.url).startswith(endpoint + '/'):
            raise httpx2.ConnectError('no other host is reachable here', request=request)
        return send(self, request, **kwargs)

    monkeypatch.setattr(httpx2.Client, 'send', recording_send)
    path = zoo.download('peer', progress=False)
    assert open(path, 'rb').read() == files['moco']
    resolve = f'{endpoint}/lab/baselines/resolve/{REVISION}/peer.pth.tar'
    assert set(contacted) == (set() if cached else {resolve}), 'the file at its commit, nothing else'
    assert constants.HF_HUB_DISABLE_TELEMETRY is False, 'the setting is restored after our call'
    assert not osp.exists(tmp_path / 'registry.json')
