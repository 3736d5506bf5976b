"""The model zoo against a real HTTP server on 127.0.0.1: download, resume, checksums, mirrors."""
import http.server
import io
import os
import os.path as osp
import subprocess
import sys
import threading

import pytest
import torch
import yaml
from helpers import digits_config
from mmengine.registry import init_default_scope

from ifnd import zoo
from ifnd.registry import MODELS

REPO = osp.join(osp.dirname(__file__), '..')


class _Server(http.server.ThreadingHTTPServer):
    """Serves files by name; can cut the first response short or serve wrong bytes."""

    def __init__(self, files: dict[str, bytes]):
        super().__init__(('127.0.0.1', 0), _Handler)
        self.files, self.cut_first, self.corrupt, self.requests = files, False, False, []
        self.html = None  # a Content-Type: answer every request with an HTML page under it


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        name = self.path.rsplit('/', 1)[-1]
        server.requests.append((name, self.headers.get('Range')))
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
    out = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'publish_model.py'), str(ckpt), '--name', 'tiny_simclr',
         '--reproduce', 'python tools/train.py CFG', '--metric', 'knn_top1', '91.5',
         'python tools/knn_eval.py CKPT', '--out-dir', str(tmp_path / 'files'), '--index', str(index)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
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
    out = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'zoo.py'), 'readme', '--check'],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
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
    out = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'zoo.py'), 'download', 'x'],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, IFND_ZOO_INDEX=str(index), IFND_HOME=str(tmp_path)))
    assert out.returncode == 1 and 'Traceback' not in out.stderr
    assert out.stderr.strip().count('\n') == 0 and "entry 'x': field 'file'" in out.stderr
