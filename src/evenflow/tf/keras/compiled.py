"""What of a compiled Keras model evenflow's exact steps can take, and what they refuse.

The exact steps weight the compiled loss per sample; that is exact for the reductions in
:data:`REDUCTIONS`, for losses that take Keras's ``sample_weight``, and for outputs without a
Keras mask under a mean reduction (Keras divides such a loss by each replica's unmasked
positions, padding copies included). A model that computes its loss or steps itself would not
see those weights: it is refused with the masked loss to use instead.
"""
from __future__ import annotations

import warnings

from evenflow.tf._lazy import keras as _keras, tf as _tf
from evenflow.tf.optimizers import presum_gradients

# Reductions whose per-replica scaling the weights can undo exactly ("mean" is Keras's alias).
REDUCTIONS = ("sum_over_batch_size", "mean", "sum")
_OWN_STEP = ("train_step", "test_step", "compute_loss")


def _reduction_of(loss) -> str:
    if loss is None or isinstance(loss, str) or (callable(loss) and not hasattr(loss, "reduction")):
        return "sum_over_batch_size"  # Keras wraps names and plain functions with its default reduction
    return str(getattr(loss, "reduction", "sum_over_batch_size"))


def loss_reduction(model) -> str:
    """The one reduction of the model's compiled loss(es); refuses one evenflow cannot make exact."""
    loss = getattr(model, "loss", None)
    if loss is None:
        raise ValueError("the model has no compiled loss: call model.compile(optimizer=..., loss=...) first")
    losses = list(loss.values()) if isinstance(loss, dict) else list(loss) if isinstance(loss, (list, tuple)) \
        else [loss]
    found = {_reduction_of(item) for item in losses if item is not None}
    found = {"sum_over_batch_size" if r == "mean" else r for r in found}
    bad = sorted(found - set(REDUCTIONS))
    if bad or len(found) > 1:
        raise ValueError(f"the compiled loss reduction must be one of {', '.join(REDUCTIONS)} (the same for every "
                         f"output), got {', '.join(sorted(found))}; compile the loss with Keras's default reduction")
    return found.pop() if found else "sum_over_batch_size"


def check_compiled(model, when: str) -> None:
    """Refuse, in one line, a model that is not a compiled ``keras.Model`` (``when``: "first", "before ...")."""
    if not isinstance(model, _keras().Model):
        raise TypeError(f"model must be a keras.Model, got {type(model).__name__}")
    if not getattr(model, "compiled", False):
        raise ValueError(f"compile the model {when}: model.compile(optimizer=..., loss=..., metrics=[...]) under "
                         f"strategy.scope()")
    presum_gradients(model.optimizer, False)  # Keras's steps need the optimizer's own sum over replicas


def check_model(model) -> None:
    """Refuse what the exact steps cannot take over; warn about losses computed from each replica's rows."""
    keras = _keras()
    check_compiled(model, "before evenflow.tf.exact_steps(model)")
    for name in _OWN_STEP:
        if getattr(type(model), name) is not getattr(keras.Model, name):
            raise ValueError(f"{type(model).__name__} overrides {name}; evenflow's exact steps weight Keras's own "
                             f"loss and metrics per sample, which your {name} would not see: in your own "
                             f"train_step, use evenflow.tf.masked_loss(per_sample_loss, mask, global_real_count) "
                             f"on the batch's meta instead")
    active = [layer.name for layer in model._flatten_layers(include_self=False)
              if getattr(layer, "activity_regularizer", None) is not None]
    if active:
        warnings.warn(f"layer(s) {', '.join(active)} of {model.name!r} have an activity_regularizer: its loss is "
                      f"computed on each replica's rows, padding copies included, so it is not the one a "
                      f"single device adds for the step's real samples (weight regularizers are exact)",
                      stacklevel=3)


def check_output_masks(y_pred, reduction: str) -> None:
    """At trace time: refuse an output with a Keras mask under a mean reduction (see the module)."""
    if reduction == "sum":
        return
    tf = _tf()
    masked = [t for t in tf.nest.flatten(y_pred) if getattr(t, "_keras_mask", None) is not None]
    if masked:
        raise ValueError("an output of the model carries a Keras mask (Embedding(mask_zero=True), Masking, ...): "
                         "Keras then divides a mean loss by each replica's unmasked positions, padding copies "
                         "included, which evenflow cannot make exact; compile the loss with reduction='sum' "
                         "(exact: the sum over the real samples' unmasked positions), or drop the mask")
