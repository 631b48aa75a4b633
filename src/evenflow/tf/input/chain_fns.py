"""The user's own map functions: how many arguments they take, and how a chain calls them.

``tf.data`` calls a map function with the elements of a tuple as positional arguments, and
with a dict as one argument; a function that takes another number fails inside TensorFlow's
tracing with ``tf__fn() missing 1 required positional argument``. The functions here check
the count against the signature first and say what the function receives and what to do.

:class:`ExampleChain` composes a user's ``parse_fn``, ``preprocess_fn`` and ``augment_fn`` the
way ``TFRecordDataset(...).map(parse).map(preprocess).map(augment)`` would, and turns their
result into evenflow's batch keys: a ``(features, label)`` pair, or a dict with ``label``.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable

from evenflow.tf._lazy import tf as _tf
from evenflow.data.source import RESERVED_KEYS

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def positional_range(fn, skip: tuple[str, ...] = ()) -> tuple[int, float] | None:
    """(required, most) positional arguments ``fn`` takes, leaving out the parameters ``skip``
    (passed by keyword); None when Python cannot tell (some builtins)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    low, high = 0, 0
    for p in params:
        if p.name in skip:
            continue
        if p.kind in _POSITIONAL:
            high += 1
            low += p.default is inspect.Parameter.empty
        elif p.kind == inspect.Parameter.VAR_POSITIONAL:
            high = math.inf
    return low, high


def takes_seed(fn) -> bool:
    """Whether ``fn`` has a parameter named ``seed`` that can be passed by keyword."""
    try:
        p = inspect.signature(fn).parameters.get("seed")
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _accepts(fn, count: int, skip: tuple[str, ...] = ()) -> bool:
    span = positional_range(fn, skip)
    return span is None or span[0] <= count <= span[1]


def _takes_text(fn, skip: tuple[str, ...] = ()) -> str:
    low, high = positional_range(fn, skip)
    n = str(low) if low == high else f"{low} or more" if high == math.inf else f"{low} to {high}"
    return f"takes {n} positional argument{'' if n == '1' else 's'}"


def check_batch_fn(fn, where: str) -> None:
    """Refuse a :class:`~evenflow.tf.input.reader.PlanReader` map function that cannot take one batch dict."""
    if not _accepts(fn, 1):
        raise TypeError(f"{where} ({_name(fn)}) {_takes_text(fn)}, but a PlanReader map function is called "
                        f"with one argument, the batch dict (features, label, id, mask, epoch, ...); take the "
                        f"batch and return it, or for per-example functions such as preprocess(image, label) "
                        f"on TFRecord files use evenflow.tf.RecordChain(files, parse_fn, preprocess_fn=...)")


_KEPT = ("label", "id", "mask", "global_real_count")  # what the trainer reads after every map function


def checked_batch_fn(fn, where: str, last: bool):
    """``fn`` as a map function that refuses, in one line, a result the trainer cannot read.

    It must return the batch dict with its keys (``features`` at the latest from the last
    function) and one row per slot, as it got them: a function that filters rows would
    drop samples the plan counts. Row counts known when traced are checked then, the rest
    at run time; the mask goes on as float32.
    """
    tf = _tf()

    def run(batch):
        out = fn(batch)
        if not isinstance(out, dict):
            raise TypeError(f"{where} ({_name(fn)}) must return the batch dict, got {type(out).__name__}; "
                            f"return the batch with your changes, e.g. {{**batch, 'features': ...}}")
        missing = [k for k in _KEPT + (("features",) if last else ()) if k not in out]
        if missing:
            raise ValueError(f"{where} ({_name(fn)}) dropped the batch key(s) {', '.join(missing)}; return every "
                             f"key it got, e.g. {{**batch, 'features': ...}}")
        rows = batch["id"].shape[0]
        checks = []
        for key in ("id", "mask", "label", "features"):
            for t in tf.nest.flatten(out.get(key, ())):
                if not tf.is_tensor(t) or not t.shape.rank:
                    continue  # a scalar, or a value the trainer's own checks see
                if rows is not None and t.shape[0] is not None and t.shape[0] != rows:
                    raise ValueError(f"{where} ({_name(fn)}) changed the rows of {key} from {rows} to "
                                     f"{t.shape[0]}; keep one row per slot: to leave a sample out, leave it "
                                     f"out of the plan's index (filtering here would drop samples the plan counts)")
                if rows is None or t.shape[0] is None:
                    n = t.nrows() if isinstance(t, tf.RaggedTensor) else \
                        t.dense_shape[0] if isinstance(t, tf.SparseTensor) else tf.shape(t)[0]
                    checks.append(tf.debugging.assert_equal(tf.cast(n, tf.int32), tf.shape(batch["id"])[0], message=(
                        f"{where} ({_name(fn)}) changed the rows of {key}; keep one row per slot")))
        out = dict(out)
        with tf.control_dependencies(checks):
            out["mask"] = tf.identity(tf.cast(out["mask"], tf.float32))
        return out

    return run


def _call(fn, value, stage: str, seed=None):
    """``fn`` called as ``tf.data.Dataset.map`` would: a tuple's (or list's, which tf.data makes a tuple)
    elements as arguments, anything else as one."""
    value = tuple(value) if isinstance(value, list) else value
    args = value if isinstance(value, tuple) else (value,)
    skip = ("seed",) if seed is not None else ()
    if not _accepts(fn, len(args), skip):
        got = f"a tuple of {len(args)}" if isinstance(value, tuple) else f"one {type(value).__name__}"
        raise TypeError(f"{stage} ({_name(fn)}) {_takes_text(fn, skip)}, but the stage before it returns {got}; "
                        f"make it take what the stage before returns (a tuple's elements are passed as "
                        f"separate arguments, as tf.data's map does)")
    return fn(*args) if seed is None else fn(*args, seed=seed)


def to_batch_keys(value, stage: str) -> dict:
    """The chain's result as batch keys: ``(features, label)`` or a dict with ``label`` (and
    ``features``, or exactly one other key, which becomes ``features``, or several, which
    become a ``features`` dict for a multi-input model)."""
    if isinstance(value, tuple) and len(value) == 2:
        return {"features": value[0], "label": value[1]}
    if isinstance(value, dict) and "label" in value:
        clash = sorted(set(value) & set(RESERVED_KEYS))
        if clash:
            raise ValueError(f"{stage} returns the keys {clash}, which evenflow adds itself; rename them")
        rest = {k: v for k, v in value.items() if k != "label"}
        if "features" in rest or not rest:
            return dict(value)
        features = next(iter(rest.values())) if len(rest) == 1 else rest
        return {"features": features, "label": value["label"]}
    shape = f"a tuple of {len(value)}" if isinstance(value, tuple) else \
        f"a dict with keys {sorted(value)}" if isinstance(value, dict) else f"one {type(value).__name__}"
    raise ValueError(f"the last stage of the chain ({stage}) must return (features, label) or a dict with a "
                     f"'label' key; it returns {shape}")


class ExampleChain:
    """``chain(element) -> batch keys`` for one example (or one batch, with batched functions).

    ``element`` holds ``serialized`` (the Example payload) and, when :attr:`seeded`, ``seed``:
    the int64 ``[2]`` stateless seed (``[batch, 2]`` for a batch) that ``augment_fn`` gets as
    ``seed=`` because it has a ``seed`` parameter. The reader computes the seeds of a whole
    row at once (:func:`~evenflow.tf.input.sample_hash.sample_seeds`): per example, the hash's
    small ops cost more than the user's augmentation.
    """

    def __init__(self, parse_fn: Callable, preprocess_fn: Callable | None, augment_fn: Callable | None):
        stages = [("parse_fn", parse_fn), ("preprocess_fn", preprocess_fn), ("augment_fn", augment_fn)]
        self.stages = [(name, fn) for name, fn in stages if fn is not None]
        self.seeded = augment_fn is not None and takes_seed(augment_fn)
        if not _accepts(parse_fn, 1):
            raise TypeError(f"parse_fn ({_name(parse_fn)}) {_takes_text(parse_fn)}, but it is called with one "
                            f"argument: the serialized tf.train.Example (a string tensor)")
        _tf()  # fail early, with the install hint, when TensorFlow is missing

    def __call__(self, element: dict) -> dict:
        value = element["serialized"]
        for name, stage in self.stages:
            value = _call(stage, value, name, element["seed"] if self.seeded and name == "augment_fn" else None)
        if isinstance(value, list):
            value = tuple(value)
        return to_batch_keys(value, self.stages[-1][0])
