"""Numeric settings, checked where a part, hook or tool is built: one line names the owner, the
key, the value and what the key takes. It imports nothing of the package: every floor uses it.

Bools are not numbers here (``beta=True`` is a slip, not 1.0), and a float must be finite in
float32, the precision the losses and the per-sample state compute in (1e300 would be inf there).
"""
import difflib
import math
import numbers
import typing

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
SEED_LIMIT = 2 ** 32  # numpy's seeds are in [0, 2**32); run seeds and the parts' seeds alike
# The smallest loss temperature accepted. The losses use log-sum-exp, so exp(1/τ) never overflows,
# but the logits cos/τ reach ±1/τ and the gradients grow with them: below 1e-3 (ten times under
# the smallest τ in use, CLIP's 0.01; recipes use 0.05 to 1) a cosine gap of 0.09 already weighs
# e^-87, float32's smallest normal number, so the loss is an arg-max hinge 1/τ times its usual
# size, and near τ = 1e-20 the gradients overflow float32 (the loss is NaN at the second step).
MIN_TEMPERATURE = 1e-3
# Largest width, length or count a model's setting may give: far above any real architecture
# (ResNet-50's widest layer is 2048, ViT-22B's width 6144, MoCo's queue 65536), far below an
# allocation that hurts.
MAX_SIZE = 1 << 20
# Most memory a model's weights and buffers may need, whoever states its sizes (a config, a
# checkpoint, a command line): sizes that pass one by one can still multiply (a 10^6-wide head on
# a 10^6 queue); ResNet-50 IFNDMoCo needs 0.3 GB, ViT-g/14 4 GB.
MAX_MODEL_BYTES = 8 << 30


class Bound(typing.NamedTuple):
    """The range of a whole number a setting (and a checkpoint's config) may give:
    ``Annotated[int, Bound(1, 64)]``."""
    low: int
    high: int


class ReadWhen(typing.NamedTuple):
    """A part's setting read only when another of its settings passes ``test`` (``condition`` in
    words), declared by the part as ``read_when = {key: ReadWhen(...)}``: the config checks warn
    where such a setting is given and would not be read."""
    setting: str
    condition: str
    test: typing.Callable[[typing.Any], bool]


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The range as written in a message: '> 0', '>= 1', 'in [0, 1)'."""
    def text(bound: float) -> str:
        return str(bound) if isinstance(bound, int) else f'{bound:g}'

    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{text(low)}, {text(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {text(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {text(high)}"
    return ''


def check_number(owner: str, key: str, value: object, kind: type = float, *,
                 low: float | None = None, high: float | None = None, low_open: bool = False,
                 high_open: bool = False, hint: str = '') -> int | float:
    """``value`` as ``kind`` (int or float) when it is one and in range; else one line naming it.

    A wrong type raises ``TypeError``, a value out of range (or not finite in float32)
    ``ValueError``; both name ``owner`` (the part), ``key``, the value and what it must be, then
    ``hint`` (the setting's meaning or the fix).
    """
    bounds = _bounds(low, high, low_open, high_open)
    what = f"{'an int' if kind is int else 'a float'}{' ' + bounds if bounds else ''}"
    tail = f': {hint}' if hint else ''
    wanted = numbers.Integral if kind is int else numbers.Real
    if not isinstance(value, wanted) or isinstance(value, bool):
        raise TypeError(f'{owner} {key} must be {what}, got {value!r} ({type(value).__name__})'
                        f'{tail}')
    number = int(value) if kind is int else float(value)
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if kind is float and not (math.isfinite(number) and abs(number) <= FLOAT32_MAX):
        what += ', finite in float32'
        below = True
    if below or above:
        raise ValueError(f'{owner} {key} must be {what}, got {value!r}{tail}')
    return number


def check_choice(owner: str, key: str, value: object, choices: tuple, hint: str = '') -> object:
    """``value`` when it is one of ``choices``; else one line naming the key, the value and the
    choices, then ``hint``."""
    if isinstance(value, bool) or value not in choices:
        tail = f': {hint}' if hint else ''
        raise ValueError(f'{owner} {key} must be one of {", ".join(map(repr, choices))}, got '
                         f'{value!r}{tail}')
    return value


def check_optional(owner: str, key: str, value: object, kind: type = float,
                   **bounds) -> int | float | None:
    """:func:`check_number` for a setting that may be None (then None)."""
    return None if value is None else check_number(owner, key, value, kind, **bounds)


def check_seed(owner: str, key: str, value: object) -> int:
    """A seed: an int in numpy's range [0, 2**32)."""
    return check_number(owner, key, value, int, low=0, high=SEED_LIMIT, high_open=True,
                        hint="numpy's seed range")


def check_temperature(owner: str, value: object) -> float:
    """A loss temperature τ: a float of at least ``MIN_TEMPERATURE`` (see there why)."""
    return check_number(owner, 'temperature', value, low=MIN_TEMPERATURE,
                        hint='the logits are cos/τ; recipes use 0.05 to 1')


def check_knn(k: object, temperature: object, bank_size: int | None = None) -> tuple[int, float]:
    """A weighted kNN's ``k`` (an int in [1, the bank's size]) and temperature (as a loss's: see
    :func:`check_temperature`), the same check for the training hook and the evaluation tools."""
    hint = f'neighbours among the {bank_size} bank images' if bank_size is not None else 'neighbours'
    return (check_number('kNN', 'k', k, int, low=1, high=bank_size, hint=hint),
            check_temperature('kNN', temperature))


def check_logit_scale(owner: str, temperature: float, beta: float) -> None:
    """Refuse a hardness β whose weighted logits (β + 1)·cos/τ leave float32's range."""
    scale = (beta + 1.0) / temperature
    if not scale <= FLOAT32_MAX:
        raise ValueError(f'{owner} weighting beta={beta:g} with temperature={temperature:g} '
                         f'weights the logits by (beta + 1) / temperature = {scale:.3g}, beyond '
                         f"float32's {FLOAT32_MAX:.3g} (the loss would be NaN): lower beta (the "
                         'configs use 1.0)')


def check_options(owner: str, options: object, known: dict) -> dict:
    """A dict-valued setting (``acceptance=dict(...)``): a dict whose keys are all in ``known``."""
    takes = ', '.join(map(str, known)) if known else 'no settings'
    if not isinstance(options, dict):
        raise TypeError(f'{owner} must be a dict ({"of " if known else "with "}{takes}), got '
                        f'{options!r} ({type(options).__name__})')
    unknown = sorted(set(options) - set(known), key=str)
    if unknown:
        close = [match for key in unknown for match in
                 difflib.get_close_matches(str(key), list(map(str, known)), n=1, cutoff=0.6)]
        fix = f'did you mean {", ".join(close)}?' if close else \
            f'remove {"it" if len(unknown) == 1 else "them"}'
        raise ValueError(f'{owner} takes {takes}, not {", ".join(map(str, unknown))}: {fix}')
    return options


def format_bytes(size: int) -> str:
    """A memory size for messages: ``'6.1 GB'``, ``'45.3 MB'``, ``'12 kB'``, ``'4 bytes'``."""
    for unit, scale in (('GB', 1e9), ('MB', 1e6)):
        if size >= scale / 10:
            return f'{size / scale:.1f} {unit}'
    return f'{size / 1e3:.0f} kB' if size >= 1000 else f'{size} bytes'
