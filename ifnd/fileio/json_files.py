"""JSON files: the project's one writer (atomic, each file's own layout), strict-JSON values and a
reader of files that may be damaged or foreign."""
import json
import math
import os

import numpy as np

from ifnd.fileio.atomic import AtomicLocalBackend
from ifnd.fileio.plain_files import open_plain


def json_safe(value: object) -> object:
    """``value`` with every non-finite float (NaN, inf) replaced by None, so it is strict JSON."""
    if isinstance(value, dict):
        return {key: json_safe(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def write_json(value: object, path: str, indent: int | None = 2, *, strict: bool = False,
               newline: bool = False, announce: bool = False) -> None:
    """Write ``value`` as JSON to ``path`` atomically (the folder is created).

    ``strict``: non-finite floats become null (:func:`json_safe`) and nothing but strict JSON is
    written; ``newline``: end the file with one; ``announce``: print where the results went.
    """
    text = json.dumps(json_safe(value) if strict else value, indent=indent, allow_nan=not strict)
    AtomicLocalBackend().put_text(text + ('\n' if newline else ''), path)
    if announce:
        print(f'Results written to {path}')


# The deepest nesting read: the project's files nest a few levels (a merged benchmark result,
# each merge two more); Python's parser and writers recurse, so a deeper file is refused here.
MAX_JSON_DEPTH = 64


def _refuse_constant(name: str) -> None:
    raise ValueError(f'{name} is not strict JSON (the project writes non-finite numbers as null)')


def _depth(value: object, limit: int) -> int:
    """How deep lists and objects nest in ``value`` (counted without recursion, up to limit + 1)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict)
                                                      else node))
    return deepest


def read_json(path: str, max_bytes: int, max_depth: int = MAX_JSON_DEPTH,
              allow_nan: bool = False, own: bool = False) -> object:
    """The strict-JSON value of the UTF-8 file ``path`` (``own``: a file the project keeps for itself,
    see :func:`~ifnd.fileio.plain_files.open_plain`).

    ``OSError`` where it cannot be read (missing, not a plain file, no permission); ``ValueError`` naming
    what is wrong where it is larger than ``max_bytes``, not UTF-8, not strict JSON (NaN,
    Infinity; read as floats with ``allow_nan``, for a caller that names where they are) or
    nested deeper than ``max_depth``. The callers judge the value's layout.
    """
    with open_plain(path, 'rb', 'JSON file', own=own) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(max_bytes + 1) if size <= max_bytes else b''  # no more, had it grown since
    if max(size, len(data)) > max_bytes:
        raise ValueError(f'{max(size, len(data)):,} bytes, more than the {max_bytes:,} such a '
                         'file may have')
    try:
        value = json.loads(data.decode('utf-8'),
                           **({} if allow_nan else {'parse_constant': _refuse_constant}))
    except UnicodeDecodeError as err:
        raise ValueError(f'not UTF-8 text (byte {err.start})') from None
    except RecursionError:
        raise ValueError(f'nested deeper than {max_depth} levels') from None
    except json.JSONDecodeError as err:
        raise ValueError(f'not JSON ({err})') from None
    if _depth(value, max_depth) > max_depth:
        raise ValueError(f'nested deeper than {max_depth} levels')
    return value
