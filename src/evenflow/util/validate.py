"""The one family of value checks: option dataclasses and public functions check their parameters here.

Each check returns the value as a plain Python ``str``, ``int``, ``float`` or ``bool``, or raises one error whose
message names the parameter, states the rule and the value, and ends with the fix when the caller gives one
(``fix="e.g. 0.003"``). A value of the wrong type raises :class:`WrongType`.
"""
from __future__ import annotations

import math
import numbers

# The largest seed: TensorFlow runs seed numpy's global generator with it (keras.utils.set_random_seed),
# which takes 32 bits; torch runs take the same limit, so a seed means the same run under both.
MAX_SEED = 2**32 - 1

# The largest global batch, in samples per step: planning one step takes about 28 bytes per sample
# (evenflow.plan.memory), so a larger step would need tens of GiB before training its first batch.
MAX_GLOBAL_BATCH = 2**31 - 1

# The learning rates a run accepts: outside them a step either changes nothing in float32 or overflows it.
LEARNING_RATES = (1e-10, 1e4)

# Plan steps per optimizer update, at most: the k micro-steps of an update are unrolled in one traced
# function on TensorFlow; past a few dozen the trace gets slow, and a larger effective batch is better
# had from a larger global batch.
MAX_ACCUMULATE_STEPS = 64


class WrongType(TypeError, ValueError):
    """A parameter of the wrong type: a ``TypeError``, and a ``ValueError`` too, like every other bad value."""


def _refuse(error: type, message: str, fix: str):
    raise error(f"{message}; {fix}" if fix else message)


def check_str(name: str, value, fix: str = "") -> str:
    if not isinstance(value, str) or not value:
        _refuse(WrongType, f"{name} must be a non-empty string, got {type(value).__name__} ({value!r})", fix)
    return value


def check_choice(name: str, value, choices, fix: str = "") -> str:
    """``value`` if it is one of ``choices`` (listed sorted in the message)."""
    check_str(name, value, fix)
    if value not in choices:
        _refuse(ValueError, f"{name} must be one of {', '.join(sorted(choices))}, got {value!r}", fix)
    return value


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None, fix: str = "") -> int:
    """An integer (numpy's too) in ``[minimum, maximum]`` (None: no bound), as an ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _refuse(WrongType, f"{name} must be an integer, got {type(value).__name__} ({value!r})", fix)
    if minimum is not None and value < minimum:
        _refuse(ValueError, f"{name} must be at least {minimum}, got {value}", fix)
    if maximum is not None and value > maximum:
        _refuse(ValueError, f"{name} must be at most {maximum}, got {value}", fix)
    return int(value)


def _g(x: float) -> str:
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")  # 1e6, not 1e+06


def _interval(low, high, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"greater than {_g(low)}" if low_open else f"at least {_g(low)}"
    if low is None:
        return f"less than {_g(high)}" if high_open else f"at most {_g(high)}"
    return f"in {'(' if low_open else '['}{_g(low)}, {_g(high)}{')' if high_open else ']'}"


def check_number(name: str, value, low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, finite: bool = True, fix: str = "") -> float:
    """A real number (numpy's too) between ``low`` and ``high`` (None: no bound; ``*_open``: the bound itself
    refused), never NaN and, with ``finite``, never infinite; as a ``float``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _refuse(WrongType, f"{name} must be a number, got {type(value).__name__} ({value!r})", fix)
    value = float(value)
    above = low is None or (value > low if low_open else value >= low)  # NaN is neither above nor below a bound
    below = high is None or (value < high if high_open else value <= high)
    if not (above and below):
        _refuse(ValueError, f"{name} must be {_interval(low, high, low_open, high_open)}, got {value:g}", fix)
    if math.isnan(value) or (finite and math.isinf(value)):
        _refuse(ValueError, f"{name} must be finite, got {value:g}", fix)
    return value


_NUMPY_BOOLS = {("numpy", "bool_"), ("numpy", "bool")}  # numpy's bool type by its name in numpy 1 and 2


def check_bool(name: str, value, fix: str = "") -> bool:
    """``True`` or ``False`` (numpy's too), as a ``bool``."""
    if not isinstance(value, bool) and (type(value).__module__, type(value).__name__) not in _NUMPY_BOOLS:
        _refuse(WrongType, f"{name} must be true or false, got {type(value).__name__} ({value!r})", fix)
    return bool(value)


def set_checked(options, name: str, check, *args, **kwargs):
    """``check`` field ``name`` of the frozen dataclass ``options`` and store the plain value it returns
    (``int`` for a numpy integer, ``bool`` for a numpy bool), so the options serialise as they read."""
    value = check(name, getattr(options, name), *args, **kwargs)
    object.__setattr__(options, name, value)
    return value


def check_learning_rate(value) -> float:
    """``learning_rate`` as a float in :data:`LEARNING_RATES`, or ``ValueError`` naming the range."""
    rate = check_number("learning_rate", value, 0, low_open=True, fix="e.g. 0.003")
    return check_number("learning_rate", rate, *LEARNING_RATES, fix="e.g. 0.003 (adam) or 0.1 (sgd)")


def check_accumulate_steps(value) -> int:
    """``accumulate_steps`` as an int in ``[1, MAX_ACCUMULATE_STEPS]``, or ``ValueError`` naming it."""
    return check_int("accumulate_steps", value, 1, MAX_ACCUMULATE_STEPS, fix="use a larger global batch for larger "
                     "updates")
