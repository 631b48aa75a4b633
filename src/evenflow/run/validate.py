"""Value checks shared by the option dataclasses: each error states the rule, the value and the fix."""
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


def check_str(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty string, got {type(value).__name__} ({value!r})")
    return value


def check_choice(name: str, value, choices) -> str:
    check_str(name, value)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(sorted(choices))}, got {value!r}")
    return value


def check_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value


def check_float(name: str, value, low: float, high: float | None = None) -> float:
    """A number in the open interval ``(low, high)`` (``high`` None: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not (value > low and (high is None or value < high)):
        bound = f"in ({low:g}, {high:g})" if high is not None else f"greater than {low:g}"
        raise ValueError(f"{name} must be {bound}, got {value:g}")
    return value


def check_finite(name: str, value: float, example: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value:g}; e.g. {example}")
    return value


def check_learning_rate(value) -> float:
    """``learning_rate`` as a float in :data:`LEARNING_RATES`, or ``ValueError`` naming the range."""
    rate = check_finite("learning_rate", check_float("learning_rate", value, 0.0), "0.003")
    low, high = LEARNING_RATES
    if not low <= rate <= high:
        raise ValueError(f"learning_rate must be in [{low:g}, {high:g}], got {rate:g}; e.g. 0.003 (adam) or 0.1 (sgd)")
    return rate


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be true or false, got {type(value).__name__} ({value!r})")
    return value


# Plan steps per optimizer update, at most: the k micro-steps of an update are unrolled in one traced
# function on TensorFlow; past a few dozen the trace gets slow, and a larger effective batch is better
# had from a larger global batch.
MAX_ACCUMULATE_STEPS = 64


def check_accumulate_steps(value) -> int:
    """``accumulate_steps`` as an int in ``[1, MAX_ACCUMULATE_STEPS]``, or ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_ACCUMULATE_STEPS:
        raise ValueError(f"accumulate_steps must be an int in [1, {MAX_ACCUMULATE_STEPS}], got {value!r}; use a "
                         f"larger global batch for larger updates")
    return int(value)
