"""Local multi-worker clusters: worker processes on 127.0.0.1, ``TF_CONFIG``, start-up deadlines, signals, cores.

Internal: ``evenflow launch`` reaches it; :class:`~evenflow.tf.Cluster` is exported by :mod:`evenflow.tf`.
"""
