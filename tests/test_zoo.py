"""The model zoo against a real HTTP server on 127.0.0.1: download, resume, checksums, mirrors,
and the Hugging Face Hub's file endpoints (``HF_ENDPOINT`` pointed at the same server)."""
import hashlib
import http.server
import io
import os
import os.path as osp
import threading

import pytest
import torch
import yaml
from helpers import digits_config, run_script
from mmengine.registry import init_default_scope

from ifnd import zoo
from ifnd.registry import MODELS

REPO = osp.join(osp.dirname(__file__), '..')


class _Server(http.server.ThreadingHTTPServer):
    """Serves files by name, and Hub files at /{repo}/resolve/{revision}/{file}; can cut the first
    response short, serve wrong bytes, or send an endless body."""

    def __init__(self, files: dict[str, bytes]):
        super().__init__(('127.0.0.1', 0), _Handler)
        self.files, self.cut_first, self.corrupt, self.requests = files, False, False, []
        self.html = None  # a Content-Type: answer every request with an HTML page under it
        self.hub = {}  # (repo, revision, file) -> bytes
        self.endless = False  # GET bodies repeat the file without Content-Length, until cut off
        self.hub_error = None  # the X-Error-Code of a Hub 404 (EntryNotFound, ...); None: a bare 404
        self.sent = 0  # body bytes the endless mode got out


ENDLESS_LIMIT = 64 * 2**20  # bounds the server in case the client never stops reading


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _hub_file(self):
        """The Hub file a /{org}/{repo}/resolve/{revision}/{file} path names, with its key."""
        parts = self.path.split('/')
        if len(parts) == 6 and parts[3] == 'resolve':
            key = (f'{parts[1]}/{parts[2]}', parts[4], parts[5])
            return key, self.server.hub.get(key)
        return None, None

    def do_HEAD(self):
        key, data = self._hub_file()
        self.server.requests.append(('HEAD', self.path))
        if data is None:
            self.send_response(404)
            if self.server.hub_error:
                self.send_header('X-Error-Code', self.server.hub_error)
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        self.send_response(200)  # the headers huggingface_hub's get_hf_file_metadata reads
        self.send_header('X-Repo-Commit', key[1])
        self.send_header('ETag', f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()

    def _endless(self, data):
        self.send_response(200)
        self.end_headers()  # no Content-Length: the body ends when the connection closes
        try:
            while self.server.sent < ENDLESS_LIMIT:
                self.wfile.write(data)
                self.server.sent += len(data)
        except OSError:
            pass  # the client stopped reading

    def do_GET(self):
        server = self.server
        key, hub_data = self._hub_file()
        name = self.path.rsplit('/', 1)[-1]
        server.requests.append((name, self.headers.get('Range')))
        if key is not None:
            if hub_data is None:
                self.send_error(404)
                return
            server.files = {**server.files, name: hub_data}
        if server.endless and name in server.files:
            self._endless(server.files[name])
            return
        if server.html:
            page = b'<!DOCTYPE html><html><body>Sign in to download this file</body></html>'
            self.send_response(200)
            self.send_header('Content-Type', server.html)
            self.send_header('Content-Length', str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if name not in server.files:
            self.send_error(404)
            return
        data = server.files[name]
        if server.corrupt:
            data = b'x' * len(data)
        start = 0
        if self.headers.get('Range'):
            start = int(self.headers['Range'].split('=')[1].split('-')[0])
            self.send_response(206)
            self.send_header('Content-Range', f'bytes {start}-{len(data) - 1}/{len(data)}')
        else:
            self.send_response(200)
        self.send_header('Content-Length', str(len(data) - start))
        self.end_headers()
        body = data[start:]
        if server.cut_first:
            server.cut_first = False
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)  # the connection drops mid-file
            return
        self.wfile.write(body)


@pytest.fixture(scope='module')
def publication(tmp_path_factory):
    """A checkpoint of a tiny SimCLR, published once into a zoo index."""
    tmp_path = tmp_path_factory.mktemp('zoo')
    init_default_scope('ifnd')
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5))
    model = MODELS.build(cfg.model)
    ckpt = tmp_path / 'epoch_1.pth'
    torch.save({'state_dict': model.state_dict(), 'optimizer': {'state': {}, 'param_groups': []},
                'meta': {'cfg': cfg.pretty_text, 'epoch': 1, 'seed': 0}}, ckpt)
    index = tmp_path / 'models.yaml'
    out = run_script('tools/publish_model.py', ckpt, '--name', 'tiny_simclr',
                     '--reproduce', 'python tools/train.py CFG', '--metric', 'knn_top1', '91.5',
                     'python tools/knn_eval.py CKPT', '--out-dir', tmp_path / 'files', '--index', index)
    assert out.returncode == 0, out.stderr[-2000:]
    return model, index.read_text(), tmp_path / 'files'


@pytest.fixture
def published(publication, tmp_path, monkeypatch):
    """The published model with a fresh index copy and an empty cache for each test."""
    model, index_text, files = publication
    index = tmp_path / 'models.yaml'
    index.write_text(index_text)
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))
    monkeypatch.setenv('IFND_HOME', str(tmp_path / 'home'))
    monkeypatch.delenv('IFND_ZOO_URL', raising=False)
    entry = zoo.info('tiny_simclr')
    return model, entry, (files / entry['file']).read_bytes(), index


def _serve(files):
    server = _Server(files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f'http://127.0.0.1:{server.server_address[1]}'


def _set_urls(index, urls):
    content = yaml.safe_load(index.read_text())
    content['models'][0]['urls'] = urls
    index.write_text(yaml.safe_dump(content))


def test_published_file_is_stripped_and_loads_weights_only(published):
    model, entry, data, _ = published
    assert entry['file'] == f'tiny_simclr_{entry["sha256"][:8]}.pth' and entry['size'] == len(data)
    assert entry['metrics'] == [{'name': 'knn_top1', 'value': 91.5,
                                 'command': 'python tools/knn_eval.py CKPT'}]
    assert entry['algorithm'] == 'SimCLR' and entry['dataset'] == 'Digits'
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    assert set(loaded) == {'state_dict', 'meta'} and 'optimizer' not in loaded


def test_download_with_progress_and_get_model_equals_the_original(published, capfd):
    model, entry, data, index = published
    server, url = _serve({entry['file']: data})
    try:
        _set_urls(index, [f'{url}/{entry["file"]}'])
        path = zoo.download('tiny_simclr')
        assert open(path, 'rb').read() == data
        assert '100%' in capfd.readouterr().err, 'a progress bar is shown'
        encoder = zoo.get_model('tiny_simclr')
        full = zoo.get_model('tiny_simclr', algorithm=True)
    finally:
        server.shutdown()
    model.eval()
    x = torch.rand(4, 3, 16, 16)
    torch.testing.assert_close(encoder.extract_feat(x), model.extract_feat(x), rtol=0, atol=0)
    torch.testing.assert_close(full.embed(x), model.embed(x), rtol=0, atol=0)


def test_resume_after_a_cut_connection(published):
    _, entry, data, index = published
    server, url = _serve({entry['file']: data})
    server.cut_first = True
    try:
        _set_urls(index, [f'{url}/{entry["file"]}'])
        path = zoo.download('tiny_simclr', progress=False)
    finally:
        server.shutdown()
    assert open(path, 'rb').read() == data
    ranges = [r for _, r in server.requests]
    assert ranges[0] is None and ranges[1] is not None and ranges[1] != 'bytes=0-'


def test_wrong_checksum_is_rejected_and_the_next_mirror_used(published, capfd):
    _, entry, data, index = published
    bad, bad_url = _serve({entry['file']: data})
    bad.corrupt = True
    good, good_url = _serve({entry['file']: data})
    try:
        _set_urls(index, [f'{bad_url}/{entry["file"]}'])
        with pytest.raises(RuntimeError, match='differs from the index'):
            zoo.download('tiny_simclr', progress=False)
        assert os.listdir(zoo.cache_dir()) == [], 'nothing is left in the cache'
        assert 'deleted' in capfd.readouterr().err
        _set_urls(index, [f'{bad_url}/{entry["file"]}', f'{good_url}/{entry["file"]}'])
        assert open(zoo.download('tiny_simclr', progress=False), 'rb').read() == data
    finally:
        bad.shutdown()
        good.shutdown()


@pytest.mark.parametrize('kind', ['file-url', 'directory'])
def test_offline_mirrors(published, tmp_path, monkeypatch, kind):
    _, entry, data, _ = published
    mirror = tmp_path / 'mirror'
    mirror.mkdir()
    (mirror / entry['file']).write_bytes(data)
    monkeypatch.setenv('IFND_ZOO_URL', mirror.as_uri() if kind == 'file-url' else str(mirror))
    assert open(zoo.download('tiny_simclr', progress=False), 'rb').read() == data


def test_unknown_names_list_the_known_ones(published):
    with pytest.raises(KeyError, match='known models: tiny_simclr'):
        zoo.info('resnet_typo')


def test_torch_hub_gives_the_same_model(published):
    model, entry, data, _ = published
    os.makedirs(zoo.cache_dir(), exist_ok=True)
    with open(osp.join(zoo.cache_dir(), entry['file']), 'wb') as f:
        f.write(data)
    hub_model = torch.hub.load(REPO, 'tiny_simclr', source='local')
    x = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(hub_model.extract_feat(x), model.eval().extract_feat(x), rtol=0, atol=0)


def test_zoo_readme_is_generated_from_the_index():
    out = run_script('tools/zoo.py', 'readme', '--check',
                     env={k: v for k, v in os.environ.items() if k != 'IFND_ZOO_INDEX'})
    assert out.returncode == 0, out.stderr + out.stdout


@pytest.mark.parametrize('content_type', ['text/html; charset=utf-8', 'application/octet-stream'])
def test_a_url_serving_a_web_page_says_so(published, content_type):
    _, entry, data, index = published
    server, url = _serve({entry['file']: data})
    server.html = content_type
    try:
        _set_urls(index, [f'{url}/{entry["file"]}'])
        with pytest.raises(RuntimeError, match='serves a web page .*use the direct link'):
            zoo.download('tiny_simclr', progress=False)
    finally:
        server.shutdown()
    assert len(server.requests) == 1, 'a web page is not fetched again'
    assert os.listdir(zoo.cache_dir()) == [], 'no partial file is kept'


def _edit_entry(index, **changes):
    content = yaml.safe_load(index.read_text())
    content['models'][0].update(changes)
    index.write_text(yaml.safe_dump(content))


@pytest.mark.parametrize('file', ['../../victim.txt', 'ABSOLUTE', 'sub/victim.txt', '..', '.',
                                  'victim\x00.pth', '.hidden', 'a b.pth'])
def test_index_file_must_be_a_plain_name_and_nothing_outside_the_cache_is_touched(
        published, tmp_path, file):
    _, entry, _, index = published
    victim = tmp_path / 'victim.txt'  # what '../../victim.txt' reaches from $IFND_HOME/checkpoints
    victim.write_text('keep me')
    os.makedirs(zoo.cache_dir())
    _edit_entry(index, file=str(victim) if file == 'ABSOLUTE' else file, sha256='0' * 64)
    with pytest.raises(ValueError) as err:
        zoo.download('tiny_simclr', progress=False)
    message = str(err.value)
    assert "entry 'tiny_simclr': field 'file'" in message and str(index) in message
    assert '\n' not in message and 'not a plain file name' in message
    assert victim.read_text() == 'keep me'


def test_index_file_outside_the_cache_is_never_written(published, tmp_path):
    _, entry, data, index = published
    server, url = _serve({'x.sh': data})  # serves the right bytes, so only the name is wrong
    try:
        _edit_entry(index, file='../../x.sh', urls=[f'{url}/x.sh'])
        with pytest.raises(ValueError, match="field 'file'"):
            zoo.download('tiny_simclr', progress=False)
    finally:
        server.shutdown()
    assert server.requests == [] and not (tmp_path / 'x.sh').exists()
    assert not osp.exists(zoo.cache_dir()) or os.listdir(zoo.cache_dir()) == []


@pytest.mark.parametrize('text, expected', [
    ('models: [name: x\n', 'is not valid YAML (line'),
    ('- name: x\n', 'holds a list, not a mapping'),
    ('models: {name: x}\n', 'field models must be a list'),
    ('models: [just-a-name]\n', 'field models holds a str'),
    ('models:\n- name: x\n  file: x.pth\n', "entry 'x': field 'sha256' is missing"),
    ('models:\n- file: x.pth\n  sha256: abc\n', "an entry: field 'name' is missing"),
    ('models:\n- {name: x, file: x.pth, sha256: abc}\n', "field 'sha256' must be 64"),
    ('models:\n- {name: x, file: x.pth, sha256: "%s", size: big}\n' % ('0' * 64), "field 'size'"),
    ('models:\n- {name: a/b, file: x.pth, checksum: none}\n', "entry 'a/b': field 'name' 'a/b' is not a plain name"),
    ('models:\n- {name: r18 v2, file: x.pth, checksum: none}\n', "field 'name' 'r18 v2' is not a plain name"),
    ('models:\n- {name: ../x, file: x.pth, checksum: none}\n', "field 'name' '../x' is not a plain name"),
    *[('models:\n- {name: x, file: x.pth, checksum: none, %s: %s}\n' % (field, size),
       f"entry 'x': field '{field}' must be a byte count from 0 to {2**40} (1 TiB), not {shown}")
      for field in ('size', 'max_size')
      for size, shown in ((10**30, 10**30), (-1, -1), ('true', True), (1.5, 1.5))],
])
def test_malformed_index_is_one_line_naming_file_and_field(tmp_path, monkeypatch, text, expected):
    index = tmp_path / 'models.yaml'
    index.write_text(text)
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))
    with pytest.raises(ValueError) as err:
        zoo.list_models()
    assert expected in str(err.value) and str(index) in str(err.value)
    assert '\n' not in str(err.value)


def test_zoo_command_reports_a_malformed_index_in_one_line(tmp_path):
    index = tmp_path / 'models.yaml'
    index.write_text('models:\n- name: x\n  file: ../x.pth\n  sha256: "%s"\n' % ('0' * 64))
    out = run_script('tools/zoo.py', 'download', 'x',
                     env=dict(os.environ, IFND_ZOO_INDEX=str(index), IFND_HOME=str(tmp_path)))
    assert out.returncode == 1 and 'Traceback' not in out.stderr
    assert out.stderr.strip().count('\n') == 0 and "entry 'x': field 'file'" in out.stderr


# Published baselines: peer layouts served as plain URLs and as Hub files, verified as published.

REVISION = 'a' * 40


@pytest.fixture(scope='module')
def peer_files():
    """Small checkpoints in the layouts of MoCo v2, mmpretrain, MoCo v3, PCL and DINO (torchvision)."""
    from test_checkpoint_layouts import mmselfsup, moco_v2_pcl, moco_v3, source_network, torchvision_file
    body = {k: v for k, v in source_network('resnet18').state_dict().items() if not k.startswith('fc.')}
    files = {}
    for layout, write in dict(moco=moco_v2_pcl, mmpretrain=mmselfsup, moco_v3=moco_v3, pcl=moco_v2_pcl,
                              dino=torchvision_file).items():
        buffer = io.BytesIO()
        torch.save(write(body, 'resnet18'), buffer)
        files[layout] = buffer.getvalue()
    return body, files


def _checks(data: bytes, how: str) -> dict:
    sha, md5 = hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest()
    return {'sha256': {'sha256': sha}, 'sha256_prefix': {'sha256_prefix': sha[:8]},
            'md5_prefix': {'md5_prefix': md5[:8]}, 'none': {'checksum': 'none'},
            'wrong_md5_prefix': {'md5_prefix': 'f' * 8 if not md5.startswith('f' * 8) else '0' * 8},
            'wrong_sha256_prefix': {'sha256_prefix': '0' * 8 if not sha.startswith('0' * 8) else 'f' * 8},
            'wrong_sha256': {'sha256': '0' * 64}}[how]


@pytest.fixture
def zoo_env(tmp_path, monkeypatch):
    """An empty cache, a loopback server as HF_ENDPOINT, and a function writing a one-entry index."""
    server, url = _serve({})
    monkeypatch.setenv('IFND_HOME', str(tmp_path / 'home'))
    monkeypatch.setenv('HF_ENDPOINT', url)
    monkeypatch.setenv('HF_HOME', str(tmp_path / 'hf_home'))  # no user token or cache is read
    monkeypatch.delenv('IFND_ZOO_URL', raising=False)
    index = tmp_path / 'models.yaml'
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))

    def publish(data: bytes, how: str, hub: bool = True, file: str = 'peer.pth.tar', **fields) -> dict:
        if hub:
            server.hub['lab/baselines', REVISION, file] = data
            source = f'hf://lab/baselines/{file}@{REVISION}'
        else:
            server.files[file] = data
            source = f'{url}/{file}'
        entry = {'name': 'peer', 'file': file, 'urls': [source], 'max_size': 2 * len(data),
                 **_checks(data, how), **fields}
        index.write_text(yaml.safe_dump({'models': [entry]}))
        return entry

    yield server, publish
    server.shutdown()


def _cache_files():
    """The zoo's cache without huggingface_hub's bookkeeping (refs, lock files, empty folders)."""
    if not osp.exists(zoo.cache_dir()):
        return []
    return sorted(osp.relpath(osp.join(d, f), zoo.cache_dir()) for d, _, files in os.walk(zoo.cache_dir())
                  for f in files if f != 'CACHEDIR.TAG' and not {'refs', '.locks'} & set(osp.join(d, f).split(os.sep)))


@pytest.mark.parametrize('layout, how', [('moco', 'md5_prefix'), ('mmpretrain', 'sha256_prefix'),
                                         ('moco_v3', 'none'), ('pcl', 'none'), ('dino', 'sha256')])
@pytest.mark.parametrize('hub', [True, False], ids=['hub', 'url'])
def test_baselines_download_verified_and_load_as_encoders(peer_files, zoo_env, layout, how, hub):
    body, files = peer_files
    server, publish = zoo_env
    publish(files[layout], how, hub=hub)
    trust = how == 'none'
    encoder = zoo.get_model('peer', progress=False, trust=trust)
    state = encoder.backbone.model.state_dict()
    assert set(state) == set(body) and all(torch.equal(state[k], body[k]) for k in body)
    assert _cache_files() == (['peer.pth.tar'] if how == 'sha256' else
                              ['peer.pth.tar', 'peer.pth.tar.verified.json'])
    if how != 'sha256':  # trust on first use: the full SHA-256 is recorded
        with open(osp.join(zoo.cache_dir(), 'peer.pth.tar.verified.json')) as f:
            record = yaml.safe_load(f)
        assert record['sha256'] == hashlib.sha256(files[layout]).hexdigest()
    if hub:
        assert ('HEAD', f'/lab/baselines/resolve/{REVISION}/peer.pth.tar') in server.requests


@pytest.mark.parametrize('how, message', [('wrong_md5_prefix', 'MD5 .* does not start with the published prefix'),
                                          ('wrong_sha256_prefix', 'SHA256 .* does not start with the published'),
                                          ('wrong_sha256', 'differs from the index')])
@pytest.mark.parametrize('hub', [True, False], ids=['hub', 'url'])
def test_wrong_hashes_and_prefixes_are_refused_and_deleted(peer_files, zoo_env, how, message, hub):
    _, files = peer_files
    _, publish = zoo_env
    publish(files['moco'], how, hub=hub)
    with pytest.raises(RuntimeError, match=message):
        zoo.download('peer', progress=False)
    assert _cache_files() == [], 'nothing is kept, nothing recorded'


@pytest.mark.parametrize('how', ['md5_prefix', 'none'])
@pytest.mark.parametrize('hub', [True, False], ids=['hub', 'url'])
def test_a_remote_file_changed_after_the_first_download_is_refused(peer_files, zoo_env, how, hub):
    _, files = peer_files
    server, publish = zoo_env
    publish(files['moco'], how, hub=hub)
    path = zoo.download('peer', progress=False, trust=True)
    os.unlink(path)  # the cached copy is gone (or was never copied here): the next call downloads
    changed = files['moco'][:-1] + bytes([files['moco'][-1] ^ 1])
    if hub:
        server.hub['lab/baselines', REVISION, 'peer.pth.tar'] = changed
        server.files = {}
    else:
        server.files['peer.pth.tar'] = changed
    with pytest.raises(RuntimeError, match='differs from the one recorded at the first download.*has changed'):
        zoo.download('peer', progress=False, trust=True)
    assert not osp.exists(path)
    # A corrupted cached copy is caught the same way, and replaced by a good download.
    server.hub['lab/baselines', REVISION, 'peer.pth.tar'] = server.files['peer.pth.tar'] = files['moco']
    server.files = {} if hub else server.files
    with open(path, 'wb') as f:
        f.write(changed)
    assert open(zoo.download('peer', progress=False), 'rb').read() == files['moco']


def test_an_entry_without_checksum_needs_trust(peer_files, zoo_env, capsys):
    _, files = peer_files
    server, publish = zoo_env
    publish(files['dino'], 'none', hub=False)
    with pytest.raises(zoo.UnverifiedError, match='publish no checksum.*--trust-remote.*trust=True'):
        zoo.get_model('peer', progress=False)
    with pytest.raises(SystemExit, match='publish no checksum'):
        zoo.main(['download', 'peer'])
    assert server.requests == [], 'nothing is fetched without the flag'
    zoo.main(['info', 'peer'])
    out = capsys.readouterr().out
    assert 'no checksum' in out and 'trust on first use' in out and 'download peer --trust-remote' in out
    zoo.main(['download', 'peer', '--trust-remote'])
    assert capsys.readouterr().out.strip() == osp.join(zoo.cache_dir(), 'peer.pth.tar')
    zoo.main(['info', 'peer'])
    out = capsys.readouterr().out
    assert 'recorded at its first download' in out and 'download: ifnd-zoo download peer\n' in out
    zoo.get_model('peer')  # from now on verified against the recorded SHA-256, no flag needed


@pytest.mark.parametrize('hub', [True, False], ids=['hub', 'url'])
@pytest.mark.parametrize('mode', ['endless', 'announced'])
def test_an_oversized_body_stops_at_the_index_size(peer_files, zoo_env, hub, mode):
    _, files = peer_files
    server, publish = zoo_env
    data = files['moco']
    if mode == 'endless':
        server.endless = True  # the announced size (Hub HEAD) is right, the body never ends
        entry = publish(data, 'md5_prefix', hub=hub, size=len(data))
    else:
        entry = publish(data, 'md5_prefix', hub=hub, max_size=len(data) // 2)  # too big for the index
    limit = entry.get('size') or entry['max_size']
    with pytest.raises(RuntimeError, match=rf"peer: .* over the {limit} bytes the index allows.*deleted"):
        zoo.download('peer', progress=False)
    assert server.sent < limit + 4 * 2**20, 'the client stopped reading soon after the limit'
    assert _cache_files() == [], 'no partial file is kept'


@pytest.mark.parametrize('urls, expected', [
    (['hf://lab/repo/x.pth@main'], 'pinned 40-hex-digit commit'),
    ([f'hf://lab/repo/..@{REVISION}'], 'plain file name'),
    ([f'hf://lab/repo/sub/x.pth@{REVISION}'], 'hf://ORG/REPO/FILE@COMMIT'),
    (['ftp://host/x.pth'], 'not an http'),
])
def test_index_sources_are_checked(tmp_path, monkeypatch, urls, expected):
    index = tmp_path / 'models.yaml'
    index.write_text(yaml.safe_dump({'models': [{'name': 'x', 'file': 'x.pth', 'checksum': 'none',
                                                 'max_size': 10, 'urls': urls}]}))
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))
    with pytest.raises(ValueError, match=f"entry 'x': field 'urls'.*{expected}"):
        zoo.list_models()


def test_an_entry_with_urls_needs_a_size_bound(tmp_path, monkeypatch):
    index = tmp_path / 'models.yaml'
    index.write_text(yaml.safe_dump({'models': [{'name': 'x', 'file': 'x.pth', 'checksum': 'none',
                                                 'urls': ['https://example.org/x.pth']}]}))
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))
    with pytest.raises(ValueError, match="field 'size' is missing: a download needs"):
        zoo.list_models()


class _FakeHfApi:
    """HfApi's upload, into the loopback server's Hub files."""
    server = None

    def create_repo(self, repo_id, repo_type=None, exist_ok=False):
        self.repo = repo_id

    def upload_file(self, *, path_or_fileobj, path_in_repo, repo_id, repo_type=None, commit_message=None):
        commit = hashlib.sha1(commit_message.encode()).hexdigest()
        with open(path_or_fileobj, 'rb') as f:
            self.server.hub[repo_id, commit, path_in_repo] = f.read()
        return type('CommitInfo', (), {'oid': commit})()


@pytest.fixture
def trained(publication, tmp_path):
    """The tiny SimCLR's model and a training checkpoint of it, as tools/train.py writes one."""
    model, _, _ = publication
    ckpt = tmp_path / 'epoch_1.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {'cfg': digits_config(
        str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5)).pretty_text}}, ckpt)
    return model, ckpt


def test_publish_pushes_to_the_hub_and_indexes_the_pinned_commit(trained, zoo_env, tmp_path, monkeypatch):
    import huggingface_hub
    from test_checkpoint_layouts import _tool
    model, ckpt = trained
    server, _ = zoo_env
    _FakeHfApi.server = server
    monkeypatch.setattr(huggingface_hub, 'HfApi', _FakeHfApi)
    index = tmp_path / 'models.yaml'
    _tool('publish_model').main([str(ckpt), '--name', 'tiny_hub', '--reproduce', 'x', '--out-dir',
                                 str(tmp_path / 'files'), '--index', str(index), '--push-to-hub', 'lab/ifnd'])
    entry = zoo.info('tiny_hub')
    (repo, commit, file), data = next(iter(server.hub.items()))
    assert repo == 'lab/ifnd' and entry['urls'] == [f'hf://lab/ifnd/{file}@{commit}']
    assert entry['sha256'] == hashlib.sha256(data).hexdigest() and entry['size'] == len(data)
    encoder = zoo.get_model('tiny_hub', progress=False)
    x = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(encoder.extract_feat(x), model.eval().extract_feat(x), rtol=0, atol=0)
    with pytest.raises(SystemExit, match="--push-to-hub 'ifnd' is not ORG/REPO"):
        _tool('publish_model').main([str(ckpt), '--name', 'x', '--reproduce', 'x', '--push-to-hub', 'ifnd'])


def test_the_repository_index_lists_the_published_baselines(monkeypatch):
    monkeypatch.delenv('IFND_ZOO_INDEX', raising=False)
    names = zoo.list_models()
    for name in ('moco_v1_r50_200e_in1k', 'moco_v2_r50_200e_in1k', 'moco_v2_r50_800e_in1k',
                 'mmpretrain_mocov2_r50_200e_in1k', 'moco_v3_r50_1000e_in1k', 'pcl_v2_r50_200e_in1k',
                 'dino_r50_in1k', 'moco_v3_vits16_300e_in1k', 'moco_v3_vitb16_300e_in1k',
                 'dino_vits16_in1k', 'dino_vitb16_in1k', 'dino_vits16_in1k_hf', 'hcsc_r50_200e_in1k',
                 'hcsc_multicrop_r50_200e_in1k'):
        entry = zoo.info(name)
        assert entry['published_in']['repository'] and len(entry['published_in']['commit']) == 40
        assert entry['metrics'][0]['reported_in'] and entry['urls']
    assert set(names) >= {'ifnd_r18half_8e_fmnist', 'simclr_r18half_8e_fmnist'}


@pytest.mark.parametrize('flags, expected', [
    (['--name', '../../escaped'], "--name '../../escaped' is not a plain name"),
    (['--name', 'r18 v2'], "--name 'r18 v2' is not a plain name"),
    (['--name', 'a/b'], "--name 'a/b' is not a plain name"),
    (['--name', '.hidden'], "--name '.hidden' is not a plain name"),
    (['--name', 'x' * 243], '--name is 243 characters long: .* a name of at most 242'),
    (['--name', 'ok', '--url', 'ftp://host/x.pth'], "--url 'ftp://host/x.pth' is not an http"),
    (['--name', 'ok', '--url', 'hf://lab/repo/x.pth@main'], '--url .* pinned 40-hex-digit commit'),
    (['--name', 'ok', '--metric', 'knn', 'high', 'cmd'], "--metric knn 'high': the value is not a number"),
    *[(['--name', 'ok', '--metric', 'knn', value, 'cmd'], f"--metric knn '{value}': .* is not a percentage")
      for value in ('nan', 'inf', '-5', '250')],
    (['--name', 'ok', '--url', 'https://user:secret@example.org/x.pth'], r'--url https://\.\.\.@example\.org carries '
     'credentials'),
    (['--name', 'ok', '--url', 'https://example.org/x.pth\nhttps://evil.example/y.pth'], '--url .* control character'),
])
def test_publish_refuses_what_the_zoo_index_would_refuse_before_writing(trained, tmp_path, flags, expected):
    from test_checkpoint_layouts import _tool
    _, ckpt = trained
    out = tmp_path / 'pub'
    before = sorted(tmp_path.rglob('*'))
    with pytest.raises(SystemExit, match=expected) as err:
        _tool('publish_model').main([str(ckpt), *flags, '--reproduce', 'x', '--out-dir', str(out / 'files'),
                                     '--index', str(out / 'models.yaml')])
    assert str(err.value).startswith('error: ') and '\n' not in str(err.value)
    assert sorted(tmp_path.rglob('*')) == before, 'nothing is written, in --out-dir or outside it'


def test_a_published_index_is_one_the_zoo_lists(trained, tmp_path, monkeypatch, capsys):
    from test_checkpoint_layouts import _tool
    _, ckpt = trained
    index = tmp_path / 'models.yaml'
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))
    publish = [str(ckpt), '--reproduce', 'x', '--out-dir', str(tmp_path / 'files'), '--index', str(index)]
    for name in ('r18.v2+ft-a_1', 'tiny'):
        _tool('publish_model').main([*publish, '--name', name, '--url', f'https://example.org/{name}.pth',
                                     '--url', f'hf://lab/ifnd/{name}.pth@{REVISION}'])
    capsys.readouterr()
    zoo.main(['list'])
    listed = capsys.readouterr().out
    assert '  r18.v2+ft-a_1 ' in listed and '  tiny ' in listed
    # An index the zoo already refuses is named, not extended, and nothing is written.
    content = yaml.safe_load(index.read_text())
    content['models'][0]['name'] = 'r18 v2'
    index.write_text(yaml.safe_dump(content))
    before = {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()}
    with pytest.raises(SystemExit, match=f"{index}: entry 'r18 v2': field 'name' 'r18 v2' is not a plain name"):
        _tool('publish_model').main([*publish, '--name', 'tiny2'])
    assert {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()} == before


def test_a_whole_file_of_another_size_than_the_index_says_is_named(published):
    _, entry, data, index = published
    server, url = _serve({entry['file']: data})
    try:
        _edit_entry(index, urls=[f'{url}/{entry["file"]}'], size=len(data) + 10)
        with pytest.raises(RuntimeError) as err:
            zoo.download('tiny_simclr', progress=False)
    finally:
        server.shutdown()
    assert (f'tiny_simclr: {url}/{entry["file"]} sent the whole file, {len(data)} bytes, but the index says '
            f'size {len(data) + 10}; fix the size in the index entry') in str(err.value)
    assert 'connection' not in str(err.value) and len(server.requests) == 1, 'named, not retried'
    assert os.listdir(zoo.cache_dir()) == [], 'no partial file is kept'


@pytest.mark.parametrize('error, expected', [
    ('EntryNotFound', f'lab/baselines has no file peer.pth.tar at commit {REVISION} (entry not found); fix the '
                      "entry's urls"),
    ('RevisionNotFound', f'lab/baselines has no commit {REVISION} (revision not found); fix the entry'),
    ('RepoNotFound', 'the Hub has no repository lab/baselines, or it is private (repository not found); fix'),
    ('GatedRepo', 'the Hub repository lab/baselines is gated; accept its terms on the Hub, then log in'),
    (None, "HTTP 404: not found on the Hub; fix the entry's urls"),
    ('plain-url', "HTTP 404 Not Found: no such file there; fix the URL (the entry's urls"),
])
def test_a_missing_file_repository_or_commit_is_named_and_not_retried(peer_files, zoo_env, error, expected):
    _, files = peer_files
    server, publish = zoo_env
    entry = publish(files['moco'], 'sha256', hub=error != 'plain-url')
    server.hub.clear()
    server.files.clear()
    server.hub_error = error if error != 'plain-url' else None
    with pytest.raises(RuntimeError) as err:
        zoo.download('peer', progress=False)
    assert f'peer: {entry["urls"][0]}: {expected}' in str(err.value)
    assert 'connection' not in str(err.value).lower() and len(server.requests) == 1, 'named, not retried'
