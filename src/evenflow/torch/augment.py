"""compatibility: the job layer moves to evenflow.data

The numpy augmentations live in :mod:`evenflow.data.augment`; this module re-exports them.
"""
from evenflow.data.augment import Augmentation, from_policy, sample_uniform

__all__ = ["Augmentation", "from_policy", "sample_uniform"]
