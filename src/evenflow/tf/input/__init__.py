"""Data sources as ``tf.data``: the plan reader, the conversion of :mod:`evenflow.data` sources to TensorFlow ops,
your own ``tf.data`` chain, packed text, augmentation and per-sample randomness.

There is one source family, :mod:`evenflow.data`; this folder converts it, it does not define another.
Internal: the public names are exported by :mod:`evenflow.tf`.
"""
