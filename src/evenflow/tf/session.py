"""Starting TensorFlow for a prepared run: strategy, model, optimizer, trainer and readers.

:func:`start_session` is :meth:`evenflow.tf.adapter.TensorFlow.start`. The strategy comes
first, because it fixes the logical devices before anything creates a tensor.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evenflow.run.adapter import Session
from evenflow.run.step_options import StepOptions
from evenflow.tf._lazy import keras as _keras
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.launch.cluster import Cluster


@dataclass(kw_only=True)
class TFSession(Session):
    """A started TensorFlow run (:class:`evenflow.run.adapter.Session`)."""

    cluster: Cluster
    strategy: object
    data: object

    def running(self) -> contextlib.AbstractContextManager:
        return self.trainer.engine.running()

    def writer(self, directory: Path):
        from evenflow.tf.summary import TFScalarWriter

        return TFScalarWriter(directory)

    def failure(self, error: BaseException) -> BaseException | None:
        """A lost peer (one line naming the worker and the checkpoint a rerun resumes from) or a bad record
        (naming file and record), else None."""
        from evenflow.tf.session import bad_input
        from evenflow.tf.strategy import collective_failure

        failure = collective_failure(error, self.cluster, run_dir=self.run_dir)
        if failure is not None:
            return failure
        return bad_input(self.data, error)


def start_session(p, cluster):
    """A :class:`~evenflow.tf.adapter.TFSession` for the :class:`~evenflow.run.job.Prepared` run ``p``."""
    from evenflow.tf.models import build_model
    from evenflow.tf.optimizers import make_optimizer
    from evenflow.tf.simulate import reserve_threads
    from evenflow.tf.state import TFState
    from evenflow.tf.strategy import Communication, make_strategy, num_workers, on_cpu
    from evenflow.tf.trainer import Trainer
    from evenflow.tf.workers_agree import check_workers_agree_tf

    cfg, comp = p.config, p.config.compute
    simulation = cfg.monitor.simulation()
    tf = _tf()
    if simulation.active:
        reserve_threads(comp.replicas)
    if comp.threads:
        tf.config.threading.set_intra_op_parallelism_threads(comp.threads)
    strategy = make_strategy(comp.replicas, cluster,
                             Communication(comp.communication, comp.bytes_per_pack, comp.collective_timeout))
    check_workers_agree_tf(strategy, p.train_plan, p.data.identity)  # before the model's first broadcast
    devices = [d.split("device:")[-1].lower() for d in strategy.extended.worker_devices]  # "cpu:0"
    cpu = on_cpu(strategy)
    if comp.precision == "mixed_float16" and cpu:
        warnings.warn("precision mixed_float16 on CPU runs float16 math in software and is slow; "
                      "use mixed_bfloat16 or float32 on CPU", stacklevel=2)
    if cfg.checkpoint.deterministic:
        tf.config.experimental.enable_op_determinism()
    _keras().utils.set_random_seed(cfg.schedule.seed)
    with strategy.scope():
        model = build_model(cfg.model.model, p.data.feature_shape, p.data.num_classes, comp.precision,
                            dropout=cfg.model.dropout, vocab_size=p.data.vocab_size)
        optimizer = make_optimizer(cfg.optimizer.optimizer, cfg.optimizer.learning_rate, comp.precision)
    trainer = Trainer.from_options(strategy, model, optimizer, StepOptions.of_config(cfg))
    train_reader, test_reader = make_readers(p)
    processes = p.processes
    return TFSession(processes=processes, cluster=cluster, strategy=strategy, trainer=trainer, devices=devices,
                     description=replicas_text(cluster, comp, devices), shared_cpu=cpu and comp.replicas > 1,
                     num_weights=int(model.count_params()),
                     state=TFState(model, optimizer, multi_worker=num_workers(strategy) > 1),
                     train_reader=train_reader, test_reader=test_reader, data=p.data,
                     summary=_facts(strategy, model, trainer, comp), run_dir=p.run_dir)


def _facts(strategy, model, trainer, comp) -> dict:
    """What TensorFlow was set to, read back from it (``summary.json``'s ``framework_info``)."""
    tf = _tf()
    facts = {"tensorflow": tf.__version__, "strategy": type(strategy).__name__,
             "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
             "op_determinism": _op_determinism(),
             "compute_dtype": str((model.layers[0] if model.layers else model).dtype_policy.compute_dtype),
             "dropout_layers": _count_dropout(model),
             "gradient_dtype": "float16" if trainer.options.compute.gradient_compression == "fp16" else "float32",
             "accumulate_steps": trainer.loop.accumulate_steps,
             "optimizer": type(getattr(trainer.optimizer, "inner_optimizer", trainer.optimizer)).__name__}
    from evenflow.tf.strategy import collective_watch

    options = getattr(strategy.extended, "_communication_options", None)
    if options is not None and num_workers_of(strategy) > 1:
        facts["communication"] = {"implementation": str(options.implementation).split(".")[-1].lower(),
                                  "bytes_per_pack": int(options.bytes_per_pack),
                                  "timeout_seconds": collective_watch(strategy).timeout}
    return facts


def _op_determinism() -> bool:
    from tensorflow.python.framework.config import is_op_determinism_enabled  # no public getter in TF 2.21

    return bool(is_op_determinism_enabled())


def num_workers_of(strategy) -> int:
    from evenflow.tf.strategy import num_workers
    return num_workers(strategy)


def _count_dropout(model) -> int:
    keras = _keras()
    layers = list(model._flatten_layers(include_self=False)) if hasattr(model, "_flatten_layers") else model.layers
    return sum(isinstance(layer, keras.layers.Dropout) for layer in layers)


def make_readers(p):
    """(train reader, test reader) of a prepared run; the test reader is None when the run evaluates nothing.

    Augmentation is a map function of the training pipeline only: evaluation reads the test
    samples as they are. Variable-length text gets its padding slots blanked (text_cnn skips
    rows without tokens); every batch is trimmed to its real rows, so a replica with fewer
    samples computes less.
    """
    from evenflow.tf.input.augment import from_policy
    from evenflow.tf.input.reader import PlanReader
    from evenflow.tf.input.text import blank_padding_rows

    cfg = p.config
    augment = from_policy(cfg.data.augment, p.data.feature_shape, seed=cfg.schedule.seed)
    pre = [blank_padding_rows] if None in p.data.feature_shape else []
    stamp = bool(cfg.monitor.telemetry)  # when each batch was made: the steps' input wait
    return (PlanReader(p.data.train, map_fns=pre + ([augment] if augment is not None else []), trim_padding=True,
                       stamp=stamp),
            None if p.data.test is None else PlanReader(p.data.test, map_fns=pre, trim_padding=True))


def bad_input(data, error: BaseException):
    """The one-line error naming the bad record behind an input pipeline failure, or None.

    TensorFlow reports a record that does not parse or decode (or a CRC error raised in a
    reading callback) as an ``OpError`` that names no sample; the dataset's ``diagnose``
    re-reads the records in Python to find it.
    """
    from evenflow.records import RecordError
    from evenflow.tf.input.pyfunc import PipelineClosed

    if getattr(data, "diagnose", None) is None:
        return None
    chain, e = [], error
    while e is not None and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    # A RecordError raised while tf.data traced a pipeline (e.g. a CRC error found when the
    # cache is filled) comes back rewritten by AutoGraph, with a traceback in its message.
    if not any(isinstance(e, (_tf().errors.OpError, PipelineClosed, RecordError)) for e in chain) and \
            "RecordError" not in str(error):
        return None
    if data.kind == "records":  # TensorFlow's own reading and image decoding, on the records both splits read
        from evenflow.tf.input.source_adapter import tf_source

        # The ids of the splits that read these records (an evaluation dataset has records of its own).
        good = np.sort(np.concatenate([s.ids for s in (data.train, data.test)
                                       if s is not None and getattr(s, "source", None) is data.records]))
        found = tf_source(data.records).find_bad_record(good)
        if found is not None or data.evaluation is None:
            return found
    return data.diagnose(error)


def replicas_text(cluster, comp, devices: list[str]) -> str:
    """E.g. "4 replicas (cpu:0, cpu:1, cpu:2, cpu:3), MirroredStrategy"."""
    listed = ", ".join(devices) if len(devices) <= 4 else devices[0] + " ..."
    if not cluster.is_multi_worker:
        return f"{comp.replicas} replicas ({listed}), MirroredStrategy"
    extras = [f"{comp.gradient_compression} gradients"] if comp.gradient_compression != "none" else []
    plural = "" if comp.replicas == 1 else "s"
    return (f"{cluster.num_workers} workers x {comp.replicas} replica{plural} ({listed} on worker {cluster.index}), "
            f"MultiWorkerMirroredStrategy ({comp.communication}, collective timeout {comp.collective_timeout:g} s"
            f"{''.join(', ' + e for e in extras)})")
