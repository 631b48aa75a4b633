"""Planning options, validated once, shared by every epoch and every topology."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

from evenflow.plan.pack import PACK_OVERFLOW
from evenflow.util.validate import check_bool, check_choice, check_int, check_number, set_checked

Balance = Literal["count", "cost"]
# The values `PlanOptions.balance` accepts.
BALANCE_MODES: tuple[str, ...] = ("cost", "count")


@dataclass(frozen=True)
class PlanOptions:
    """How samples are grouped into global steps and split among replicas.

    Args:
        global_batch_size: samples per global step G, summed over replicas, >= 1.
        seed: non-negative integer; with the epoch it fixes every random choice.
        stratify: keep each step's label mix close to the dataset's and give each
            replica its proportional share of every label (needs labels).
        balance: ``"count"`` (equal sample counts scaled by weight) or ``"cost"``
            (equal summed cost scaled by weight; needs costs to matter).
        bucket: group samples of similar cost into the same step (needs costs).
        drop_remainder: drop the last, partial global step of each epoch.
        bucket_window: with ``bucket``, how many global steps' worth of samples
            are sorted together; larger means less padding and less randomness.
        pack: 0 (off) or L: lay samples back to back into rows (packs) of at most L
            tokens (:mod:`evenflow.plan.pack`; needs costs that are token counts);
            ``global_batch_size`` then counts packs, and each replica's batch is
            ``[rows, L]``.
        pack_overflow: with ``pack``, a sample longer than L is an error (``"error"``)
            or is split into pieces of at most L tokens (``"split"``).
        pack_attention: with ``pack`` and ``balance="cost"``, a pack costs its tokens
            plus this times the sum of its samples' squared lengths (attention).

    ``bucket_window`` without ``bucket``, and ``pack_overflow`` or ``pack_attention`` without
    ``pack``, are refused unless they keep their defaults: they would change nothing.
    """

    global_batch_size: int
    seed: int = 0
    stratify: bool = False
    balance: Balance = "count"
    bucket: bool = False
    drop_remainder: bool = False
    bucket_window: int = 256
    pack: int = 0
    pack_overflow: str = "error"
    pack_attention: float = 0.0

    def __post_init__(self):
        for name, minimum in (("global_batch_size", 1), ("seed", 0), ("bucket_window", 1), ("pack", 0)):
            set_checked(self, name, check_int, minimum)
        check_choice("pack_overflow", self.pack_overflow, PACK_OVERFLOW)
        set_checked(self, "pack_attention", check_number, 0)
        check_choice("balance", self.balance, BALANCE_MODES)
        for name in ("stratify", "bucket", "drop_remainder"):
            set_checked(self, name, check_bool)
        self._refuse_unused()
        if self.pack and (self.stratify or self.bucket):
            which = "stratify" if self.stratify else "bucket"
            raise ValueError(f"pack={self.pack} cannot be combined with {which}=True: packs are planned whole, "
                             f"every row {self.pack} tokens wide; turn {which} off or pack=0")

    @property
    def assignment(self) -> str:
        """The name of the algorithm that splits each step among replicas: ``"packed"`` (``pack`` > 0),
        ``"stratified"`` (``stratify`` with count balance), else the balance, ``"cost"`` or ``"count"``.

        :data:`evenflow.plan.window.ASSIGNMENTS` maps the name to its function (a packed plan splits its
        packs by :data:`evenflow.plan.assign.pack.PACK_SPLITS` of the balance).
        """
        if self.pack:
            return "packed"
        return "stratified" if self.stratify and self.balance == "count" else self.balance

    def _refuse_unused(self) -> None:
        """An option that only shapes bucketed or packed plans, set away from its default on a plan
        that is neither, would change nothing: refused, so a typo or a missing flag is not ignored."""
        fields = type(self).__dataclass_fields__
        for name, needs, on in (("bucket_window", "bucket=True", self.bucket),
                                ("pack_overflow", "pack=L", bool(self.pack)),
                                ("pack_attention", "pack=L", bool(self.pack))):
            if not on and getattr(self, name) != fields[name].default:
                raise ValueError(f"{name}={getattr(self, name)!r} shapes only plans with {needs}, and this one "
                                 f"has none; pass {needs} or leave {name} out")

    def check_against(self, index, topology) -> None:
        """Raise if these options cannot plan ``index`` on ``topology``; warn if they are pointless."""
        g, r = self.global_batch_size, topology.replicas
        if g < r:
            raise ValueError(
                f"global_batch_size must be at least the number of replicas so every replica gets a "
                f"sample in each full step: global_batch_size is {g} and replicas is {r}; "
                f"use a global batch size of at least {r} (a multiple of {r} is best) or fewer replicas")
        if self.stratify and index.labels is None:
            raise ValueError("stratify=True needs labels, but the index has none; "
                             "build the Index with labels=... or turn stratify off")
        if self.pack and index.costs is None:
            raise ValueError("pack needs each sample's length in tokens as its cost, but the index has no costs; "
                             "build the Index with costs=lengths (a TextSource's index() does; evenflow inspect: "
                             "--costs or a text --dataset) or pack=0")
        if self.bucket and index.costs is None:
            raise ValueError("bucket=True needs costs, but the index has none; "
                             "build the Index with costs=... (e.g. sequence lengths) or turn bucket off")
        if self.balance == "cost" and index.costs is None:
            warnings.warn("balance='cost' without costs treats every sample as cost 1, "
                          "which is the same as balance='count'", stacklevel=3)
        if self.drop_remainder and not self.pack and index.num_samples < g:
            raise ValueError(
                f"drop_remainder=True with fewer samples than one global batch leaves nothing to train: "
                f"num_samples is {index.num_samples} and global_batch_size is {g}; "
                f"use drop_remainder=False or a global batch size of at most {index.num_samples}")
