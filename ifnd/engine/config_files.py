"""Config files read with one-line errors: syntax errors by file and line, ``_base_`` cycles, Python as YAML;
read as :class:`RunConfig`, whose text is formatted once."""
import ast
import os.path as osp

from mmengine.config import Config

from ifnd.fileio import check_plain_file


class RunConfig(Config):
    """mmengine's Config whose ``pretty_text`` is formatted once for each content.

    A run writes its config five times (the log, vis_data, the work dir's copy, the message hub, every
    checkpoint), and mmengine formats the whole text with yapf each time: over a second of CPU for a
    benchmark's config, most of what a short run does after its imports. The text follows from the
    settings alone, so it is formatted again only when they have changed.
    """

    @property
    def pretty_text(self) -> str:
        key = (repr(self.to_dict()), self._format_python_code)
        formatted = self.__dict__.get('_formatted')
        if formatted is None or formatted[0] != key:
            formatted = (key, super().pretty_text)
            object.__setattr__(self, '_formatted', formatted)  # Config's own __setattr__ sets a setting
        return formatted[1]


def as_run_config(cfg: Config) -> RunConfig:
    """The same config (settings, file, text) as a :class:`RunConfig`; copies keep the class."""
    run = RunConfig.__new__(RunConfig)
    run.__dict__.update(cfg.__dict__)
    return run


def _syntax_error_in(path: str, seen: set[str] | None = None) -> SyntaxError | None:
    """The first syntax error in a Python config or the ``_base_`` files it names, with its file."""
    seen = set() if seen is None else seen
    path = osp.abspath(path)
    if path in seen or not osp.isfile(path) or not path.endswith('.py'):
        return None
    seen.add(path)
    with open(path, encoding='utf-8') as f:
        text = f.read()
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as err:
        return err
    for base in _base_files(path, tree):
        found = _syntax_error_in(base, seen)
        if found is not None:
            return found
    return None


def _base_files(path: str, tree: ast.Module) -> list[str]:
    """The ``_base_`` files a parsed Python config names, as absolute paths (literal lists only)."""
    files = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], 'id', None) == '_base_'):
            try:
                bases = ast.literal_eval(node.value)
            except ValueError:
                return files
            for base in [bases] if isinstance(bases, str) else bases:
                if isinstance(base, str):
                    files.append(osp.abspath(osp.join(osp.dirname(path), base)))
    return files


def _base_cycle(path: str, chain: tuple[str, ...] = ()) -> list[str] | None:
    """A cycle of ``_base_`` files reached from a Python config (first file repeated at the end)."""
    path = osp.abspath(path)
    if path in chain:
        return list(chain[chain.index(path):]) + [path]
    if not osp.isfile(path) or not path.endswith('.py'):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, ValueError, OSError):
        return None
    for base in _base_files(path, tree):
        found = _base_cycle(base, chain + (path,))
        if found is not None:
            return found
    return None


def load_config(path: str) -> RunConfig:
    """``Config.fromfile`` with one-line errors: syntax errors by file and line, Python as YAML,
    ``_base_`` files that include each other."""
    check_plain_file(path, 'config file')  # a FIFO would never end a read
    cycle = _base_cycle(path)
    if cycle is not None:  # mmengine would recurse until RecursionError
        start = osp.dirname(cycle[0])
        names = ' -> '.join(osp.relpath(f, start) for f in cycle)
        raise ValueError(f'config {path}: its _base_ files include each other ({names}); remove one '
                         'of these _base_ entries')
    try:
        return as_run_config(Config.fromfile(path))
    except SyntaxError as err:
        found = _syntax_error_in(path) or err
        where = found.filename if found.filename not in (None, '<unknown>') else path
        raise ValueError(f'config {where} line {found.lineno}: {found.msg}; fix the file') from None
    except Exception as err:
        if osp.splitext(path)[1].lower() in ('.yaml', '.yml', '.json'):
            with open(path, encoding='utf-8', errors='replace') as f:
                text = f.read()
            try:
                compile(text, path, 'exec')
                python = True
            except SyntaxError:
                python = False
            if python:
                raise ValueError(f'config {path} is Python, not {osp.splitext(path)[1][1:]}: '
                                 f'rename it to {osp.splitext(path)[0]}.py') from None
        reason = ' '.join(str(err).split()) or type(err).__name__
        raise ValueError(f'cannot read config {path} ({type(err).__name__}: {reason}); check the '
                         'file') from None
