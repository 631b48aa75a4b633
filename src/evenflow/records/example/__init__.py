"""``tf.train.Example`` without TensorFlow: message classes, encoding, batch decoding, feature specs and keys.

Internal: the public names are exported by :mod:`evenflow.records`.
"""
