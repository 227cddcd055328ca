"""The rule for a failing group, written once (serve/batching.each_alone) for both batchers."""
from __future__ import annotations

import pytest

from adalayers.errors import Cancelled, DataError
from adalayers.serve.batching import each_alone


def test_a_failing_group_is_rerun_one_request_at_a_time():
    runs = []

    def run(jobs):
        runs.append(list(jobs))
        if "bad" in jobs:
            raise DataError("bad input")
        return [j.upper() for j in jobs]

    assert each_alone(run, ["a", "b"]) == [(True, "A"), (True, "B")] and runs == [["a", "b"]]
    runs.clear()
    got = each_alone(run, ["a", "bad", "c", "gone"], skip=lambda j: j == "gone")
    assert got[0] == (True, "A") and got[2] == (True, "C") and got[3] is None
    assert got[1][0] is False and str(got[1][1]) == "bad input"
    assert runs == [["a", "bad", "c", "gone"], ["a"], ["bad"], ["c"]]  # the skipped one is not rerun
    (alone,) = each_alone(run, ["bad"])
    assert alone[0] is False and len(runs) == 5  # a group of one is not rerun


def test_a_cancelled_group_is_nobodys_answer():
    def run(jobs):
        raise Cancelled("every client left")
    with pytest.raises(Cancelled):
        each_alone(run, ["a", "b"])
