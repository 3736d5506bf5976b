"""Bad input (paths, configs, checkpoints, data) reported by the tools as one line, not a traceback."""
import contextlib
import os
from collections.abc import Iterator

# Exceptions that report bad input (paths, configs, registry names, checkpoints, data, a diverged
# run): the tools print their message alone; IFND_DEBUG=1 shows the traceback.
INPUT_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError, FloatingPointError)


@contextlib.contextmanager
def input_errors_as_messages() -> Iterator[None]:
    """Turn bad-input exceptions into a one-line ``error: ...`` and exit status 1."""
    try:
        yield
    except INPUT_ERRORS as err:
        if os.environ.get('IFND_DEBUG'):
            raise
        message = str(err.args[0] if isinstance(err, KeyError) and err.args else err)
        if 'Original Traceback' in message:  # re-raised from a loader worker: keep the worker's line
            message = message.strip().splitlines()[-1].split(': ', 1)[-1]
        if isinstance(err, TypeError) and 'unexpected keyword argument' in message:
            message += '; check its spelling in the config or --cfg-options'
        raise SystemExit(f'error: {" ".join(message.split())}') from None
