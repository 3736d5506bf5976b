"""The model zoo: list, describe, download (verified, resumable) and load published checkpoints.

The index is ``model_zoo/models.yaml``: this project's models and published baselines of other
methods. Each file is verified as far as its authors allow: a full SHA-256; a published MD5 or
SHA-256 prefix, checked as such, after which the file's full SHA-256 is recorded in the cache and
required of every later download (trust on first use); or, when the authors publish no checksum,
nothing, so such an entry downloads only with ``trust=True`` (``--trust-remote``).

Downloads go to ``$IFND_HOME/checkpoints`` (default ``~/.cache/ifnd``). A source is a URL or a
Hugging Face Hub file, ``hf://ORG/REPO/FILE@COMMIT`` (fetched, cached and resumed by
``huggingface_hub``; ``HF_ENDPOINT`` names another Hub). ``IFND_ZOO_URL`` names a mirror tried
before an entry's own sources: an ``http(s)://`` or ``file://`` base URL, or a plain directory,
holding the files by name.

- ``index.py``: reading and checking the index, ``list_models`` and ``info``
- ``errors.py``: what a source, a checksum or the cache refuses
- ``cache.py``: the cache folder, checksums and the records of first downloads
- ``sources.py``: fetching from a URL or a mirror folder; ``hub.py``: from the Hugging Face Hub
- ``loading.py``: ``download``, ``load_checkpoint``, ``get_model`` and ``checkpoint_path``
  (``zoo:NAME``, as ``model.pretrained`` of a linear evaluation takes it)
- ``readme.py``: ``model_zoo/README.md`` generated from the index; ``cli.py``: ``ifnd-zoo``
"""
from .cache import cache_dir, sha256sum, verification
from .cli import main
from .errors import (CacheLinkError, ChecksumError, OversizeError, PermanentError, SizeError,
                     SourceNotFoundError, UnverifiedError, WebPageError)
from .index import (INDEX_PATH, ZooIndexError, check_entry, check_index, info, list_models,
                    plain_name, read_index_file, source_problem)
from .loading import ZOO_PREFIX, checkpoint_path, download, get_model, load_checkpoint
from .readme import is_baseline, render_readme

__all__ = ['CacheLinkError', 'ChecksumError', 'INDEX_PATH', 'OversizeError', 'PermanentError',
           'SizeError', 'SourceNotFoundError', 'UnverifiedError', 'WebPageError', 'ZOO_PREFIX',
           'ZooIndexError', 'cache_dir', 'check_entry', 'check_index', 'checkpoint_path', 'download',
           'get_model', 'info', 'is_baseline', 'list_models', 'load_checkpoint', 'main', 'plain_name',
           'read_index_file', 'render_readme', 'sha256sum', 'source_problem', 'verification']
