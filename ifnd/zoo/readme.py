"""``model_zoo/README.md``, generated from the index."""
import os
import os.path as osp

from .cache import verification
from .index import INDEX_PATH, REPO_ROOT, entry_error, read_index


README_PATH = osp.join(REPO_ROOT, 'model_zoo', 'README.md')
README_FIELDS = ('algorithm', 'backbone', 'dataset', 'epochs', 'size', 'sha256', 'config', 'reproduce')
# A published baseline (an entry citing its authors' file in ``published_in``) needs these.
BASELINE_FIELDS = ('algorithm', 'backbone', 'dataset', 'epochs', 'published_in', 'metrics')


def is_baseline(entry: dict) -> bool:
    """Whether an entry is another method's published checkpoint (not trained here)."""
    return 'published_in' in entry


def _cite(published_in: dict) -> str:
    return (f'{published_in.get("repository")}, `{published_in.get("path")}` at '
            f'{str(published_in.get("commit"))[:12]}')


def _checksum_words(entry: dict) -> str:
    if entry.get('sha256'):
        return f'SHA-256 `{entry["sha256"][:16]}…`'
    for field, words in (('sha256_prefix', 'SHA-256 prefix'), ('md5_prefix', 'MD5 prefix')):
        if entry.get(field):
            return f'{words} `{entry[field]}`, then trust on first use'
    return 'none published: `--trust-remote`'


def render_readme(index_path: str | None = None) -> str:
    """``model_zoo/README.md``, generated from the index."""
    path = index_path or os.environ.get('IFND_ZOO_INDEX', INDEX_PATH)
    entries = [info for _, info in sorted(read_index(path).items())]
    for entry in entries:
        for field in BASELINE_FIELDS if is_baseline(entry) else README_FIELDS:
            if field not in entry:
                raise entry_error(path, entry, field, 'is missing (the model table needs it)')
    ours = [e for e in entries if not is_baseline(e)]
    baselines = [e for e in entries if is_baseline(e)]
    lines = ['# Model zoo', '',
             '<!-- Generated from models.yaml by `python tools/zoo.py readme`; do not edit. -->', '',
             'Load a model in Python with `ifnd.zoo.get_model(NAME)` (the backbone as an `Encoder`; '
             '`algorithm=True` for the whole model of ours), download one with '
             '`ifnd-zoo download NAME`, see how it is verified with `ifnd-zoo info NAME`. '
             '`IFND_ZOO_URL` points at a mirror (URL or folder) holding the files.', '',
             '## Ours', '',
             '| name | algorithm | backbone | data set | epochs | metrics | file | size | SHA-256 |',
             '|---|---|---|---|---|---|---|---|---|']
    for e in ours:
        metrics = '<br>'.join(f'{m["name"]}: {m["value"]}' for m in e.get('metrics', []))
        lines.append(f'| {e["name"]} | {e["algorithm"]} | {e["backbone"]} | {e["dataset"]} | '
                     f'{e["epochs"]} | {metrics} | {e["file"]} | {e["size"] / 2**20:.1f} MiB | '
                     f'`{e["sha256"][:16]}…` |')
    lines += ['', '## Published baselines', '',
              'Other methods\' checkpoints from their authors\' own links, read with the layout '
              'readers of `ifnd/models/encoder.py`. Accuracies are the authors\' reports, not '
              'measured here.', '',
              '| name | method | backbone | data set | epochs | reported | checksum | source |',
              '|---|---|---|---|---|---|---|---|']
    for e in baselines:
        reported = '<br>'.join(f'{m["name"]}: {m["value"]}' for m in e['metrics'])
        epochs = e['epochs'] if e['epochs'] is not None else 'not stated'
        lines.append(f'| {e["name"]} | {e["algorithm"]} | {e["backbone"]} | {e["dataset"]} | '
                     f'{epochs} | {reported} | {_checksum_words(e)} | {_cite(e["published_in"])} |')
    lines.append('')
    for e in ours + baselines:
        lines += [f'## {e["name"]}', '', e.get('description', '').strip(), '']
        if is_baseline(e):
            lines.append(f'- published in: {_cite(e["published_in"])}')
        else:
            lines += [f'- config: `{e["config"]}`', f'- reproduce: `{e["reproduce"]}`']
        lines += ['- download: ' + (', '.join(e.get('urls') or []) or
                                     'no public URL yet: serve the file from a mirror '
                                     '(`IFND_ZOO_URL`)'),
                  f'- verification: {verification(e)}']
        lines += [f'- {m["name"]} = {m["value"]}, ' + (f'measured with `{m["command"]}`'
                                                        if 'command' in m else
                                                        f'reported in {m.get("reported_in", "?")}')
                  for m in e.get('metrics', [])]
        lines.append('')
    return '\n'.join(lines)
