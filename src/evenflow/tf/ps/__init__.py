"""Parameter-server training: the cluster, the chief's session and engine, the models the servers hold, the launcher.

From Python: :func:`make_strategy` on the chief, a model from :func:`make_mlp` or :func:`make_hashed_text`
built under its scope, and :class:`PSTrainer`. ``evenflow train --strategy ps`` and
``evenflow launch --ps`` use the same pieces. Importing this package does not import TensorFlow.
"""
from evenflow.tf.ps.models import make_hashed_text, make_mlp
from evenflow.tf.ps.training import PSTrainer, make_strategy

__all__ = ["PSTrainer", "make_hashed_text", "make_mlp", "make_strategy"]
