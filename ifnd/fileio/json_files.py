"""JSON files: the project's one writer (atomic, each file's own layout) and strict-JSON values."""
import json
import math

import numpy as np

from ifnd.fileio.atomic import AtomicLocalBackend


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
