"""The chief copies a finished step's outputs again when the copy fails in transit, never re-running the step."""
from __future__ import annotations

import pytest
import tensorflow as tf

from evenflow.tf.ps.engine import FETCH_TRIES, fetch


class _Remote:
    """A ``RemoteValue`` stand-in: ``fetch()`` raises the queued errors, then returns ``value``."""

    def __init__(self, errors, value=None, closure_error=None):
        self.errors, self.value, self._error, self.calls = list(errors), value, closure_error, 0

    def fetch(self):
        self.calls += 1
        if self._error is not None:
            raise self._error
        if self.errors:
            raise self.errors.pop(0)
        return self.value


def _parse_error():
    return tf.errors.InternalError(None, None, "2 root error(s) found.\n(0) INTERNAL: Unable to parse request")


def test_a_copy_that_fails_in_transit_is_made_again_with_a_warning():
    remote = _Remote([_parse_error(), tf.errors.CancelledError(None, None, "RecvFromRemoteAsync is cancelled.")],
                     value=(1.0, 2.0))
    with pytest.warns(RuntimeWarning) as seen:
        assert fetch(remote, "a training step's outputs") == (1.0, 2.0)
    assert remote.calls == 3
    assert [str(w.message) for w in seen] == [
        "copying a training step's outputs from its worker failed (InternalError: 2 root error(s) found.); "
        "trying again (1 of 2)",
        "copying a training step's outputs from its worker failed (CancelledError: RecvFromRemoteAsync is "
        "cancelled.); trying again (2 of 2)"]


def test_a_copy_that_keeps_failing_raises_its_last_error():
    remote = _Remote([_parse_error() for _ in range(FETCH_TRIES)])
    with pytest.warns(RuntimeWarning), pytest.raises(tf.errors.InternalError, match="Unable to parse request"):
        fetch(remote, "an evaluation step's sums")
    assert remote.calls == FETCH_TRIES


def test_an_error_of_the_closure_itself_is_raised_at_once():
    remote = _Remote([], closure_error=tf.errors.InternalError(None, None, "the step failed on the worker"))
    with pytest.raises(tf.errors.InternalError, match="the step failed"):
        fetch(remote, "a training step's outputs")
    assert remote.calls == 1


def test_other_errors_are_not_tried_again():
    remote = _Remote([tf.errors.InvalidArgumentError(None, None, "bad shape")])
    with pytest.raises(tf.errors.InvalidArgumentError):
        fetch(remote, "a training step's outputs")
    assert remote.calls == 1
