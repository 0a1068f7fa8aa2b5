"""How the supervisor reads an attempt's end: from the codes each worker recorded (torchrun always says 1)."""

import pytest

from trainforge import contract
from trainforge.trainer.local import classify


def record(tmp_path, **codes):
    for rank, code in codes.items():
        (tmp_path / f"{rank}.code").write_text(str(code))
    return tmp_path


@pytest.mark.parametrize("codes, expected", [
    ({"rank0": 0, "rank1": 0}, ("ok", 0)),
    ({"rank0": 2, "rank1": 2}, ("user_error", 2)),
    ({"rank0": 1, "rank1": contract.EXIT_PREEMPTED}, ("user_error", 1)),  # rank 0 crashed, torchrun stopped rank 1
    ({"rank0": contract.EXIT_PREEMPTED, "rank1": contract.EXIT_PREEMPTED}, ("retry", contract.EXIT_PREEMPTED)),
    ({"rank0": 1}, ("retry", -9)),  # rank 1 was killed; rank 0's collective then failed: the kill is the cause
    ({}, ("retry", -9)),
])
def test_attempt_outcomes(tmp_path, codes, expected):
    returncode = 0 if expected[0] == "ok" else 1
    assert classify(returncode, record(tmp_path, **codes), world_size=2) == expected
