"""Keras glue: ``evenflow.tf.fit`` and its parts (exact steps, plan batches for ``model.fit``, the run as a callback).

Internal: the public names are exported by :mod:`evenflow.tf`.
"""
