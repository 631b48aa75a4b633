"""The TensorFlow model state in a checkpoint: the variables of model and optimizer as a tensor bundle.

:class:`TFState` is the :class:`evenflow.run.checkpoints.ModelState` of a Keras model and
its optimizer. It writes ``state.index`` / ``state.data-*`` with ``tf.train.Checkpoint``
(TensorFlow's own tensor bundle; no pickle). The model's and the optimizer's variables are
saved as two flat lists — ``model.variables`` (weights and random states such as a dropout
layer's seed generator) and ``optimizer.variables`` (iteration count, learning rate, slots,
loss scale) — because Keras 3 models are not tracked attribute by attribute by
``tf.train.Checkpoint``.

Under MultiWorkerMirroredStrategy every worker must take part in a save
(``needs_every_process``); the run layer's checkpointer gives the others a scratch directory.
"""
from __future__ import annotations

from pathlib import Path

from evenflow.tf._lazy import tf as _tf


def _describe(variables) -> list[list]:
    return [[getattr(v, "path", v.name), list(v.shape), v.dtype if isinstance(v.dtype, str) else v.dtype.name]
            for v in variables]


_ALL_FINITE = []


def _tf_variable(variable):
    """The TensorFlow variable behind a Keras variable (or ``variable`` itself): a ``tf.function`` takes it as an
    argument in ~1 ms where it takes a list of Keras variables in ~5 (an MLP's 19)."""
    inner = getattr(variable, "value", variable)
    return inner if isinstance(inner, _tf().Variable) else variable


def _all_finite():
    """One compiled check instead of two eager ops per variable (14 -> ~1 ms for an MLP).

    One function for every state, taking the variables as its argument: a state per ``fit``
    call then reuses the trace of an earlier one with the same variable shapes (a function
    per state would trace once each, and TensorFlow warns of retracing after a few).
    """
    if not _ALL_FINITE:
        tf = _tf()
        _ALL_FINITE.append(tf.function(
            lambda variables: tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables]),
            autograph=False, reduce_retracing=True))
    return _ALL_FINITE[0]


class TFState:
    """Model and optimizer variables of one run (see the module docstring).

    Args:
        model: a built ``keras.Model``.
        optimizer: its optimizer, built (e.g. by the trainer).
        multi_worker: whether the strategy spans several workers (every worker then writes).
    """

    def __init__(self, model, optimizer, multi_worker: bool = False):
        tf = _tf()
        self.model, self.optimizer = model, optimizer
        self.needs_every_process = bool(multi_worker)
        self._model_vars, self._opt_vars = list(model.variables), list(optimizer.variables)
        self._float_vars = [_tf_variable(v) for v in self._model_vars + self._opt_vars
                            if tf.as_dtype(v.dtype).is_floating]
        self._ckpt = tf.train.Checkpoint(**{f"model_{i:04d}": v for i, v in enumerate(self._model_vars)},
                                         **{f"optimizer_{i:04d}": v for i, v in enumerate(self._opt_vars)})

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.learning_rate.numpy())

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.optimizer.learning_rate = float(value)

    def describe(self) -> dict:
        return {"model_variables": _describe(self._model_vars), "optimizer_variables": _describe(self._opt_vars)}

    def is_finite(self) -> bool:
        return not self._float_vars or bool(_all_finite()(self._float_vars))

    def write(self, directory: Path) -> None:
        tf = _tf()
        try:
            self._ckpt.write(str(Path(directory) / "state"))
        except tf.errors.OpError as e:  # e.g. a full disk: an OSError the run reports in one line
            raise OSError(f"{Path(directory).parent}: the checkpoint's variables could not be written "
                          f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}); free disk space or choose "
                          f"another --output-dir, then run the same command again") from None

    def read(self, directory: Path) -> None:
        """Load the variables; ``OSError``/``ValueError`` (one line) when the bundle does not load."""
        prefix = str(Path(directory) / "state")
        if not Path(prefix + ".index").is_file():
            raise OSError(f"{prefix}.index is missing")
        try:
            status = self._ckpt.read(prefix)
            status.assert_consumed()
        except Exception as e:  # OpError, AssertionError, and IndexError for a truncated state.data-*
            raise ValueError(f"{directory}: the variables do not load ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:200]})") from None
