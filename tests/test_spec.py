"""A wrong job spec never gives a traceback: the message names the field, the bad value and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from support.repo import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainforge.trainer.spec import SpecError, load_spec, parse_spec
from support.repo import SPECS

QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def rejected(raw) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(raw, "job.yaml")
    return str(info.value)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_example_specs_are_valid(path):
    load_spec(path)


@pytest.mark.parametrize("change, expected", [
    ({"name": "Quick_Start"}, "name: String should match pattern"),
    ({"capacity": "cheap"}, "capacity: Input should be 'on-demand', 'spot' or 'spot-fallback' (got 'cheap')"),
    ({"resources": {"instance_type": "p5.24xlarge"}}, "resources.instance_type: 'p5.24xlarge' is not in the GPU catalogue"),
    ({"resources": {"instance_type": "g6.xlarge", "gpus_per_node": 4}}, "gpus_per_node: g6.xlarge has 1 GPUs, asked for 4. Fix: at most 1"),
    ({"resources": {"gpu_type": "K80"}}, "resources.gpu_type: 'K80' is not a GPU trainforge knows"),
    ({"entry": {"task": "char_lm", "command": ["python"]}}, "entry: give exactly one of entry.task or entry.command"),
    ({"limits": {"max_runtime": "two hours"}}, "limits.max_runtime: 'two hours' is not a duration. Fix: a number and a unit, e.g. 45m, 2h, 1h30m or 1d"),
    ({"workers": {"nodes": 0}}, "workers.nodes: Input should be greater than or equal to 1 (got 0)"),
    ({"hyperparameters": {"job_id": "x"}}, "hyperparameters: ['job_id'] are set by the submitter"),
    ({"prioritty": "high"}, "prioritty: Extra inputs are not permitted (got 'high') Fix: remove it or correct the spelling."),
])
def test_bad_fields_are_named_with_the_fix(change, expected):
    assert expected in rejected({**QUICKSTART, **change})


def test_missing_fields_say_so():
    raw = dict(QUICKSTART)
    del raw["team"]
    assert "team: Field required Fix: add it." in rejected(raw)


def test_unreadable_files_are_spec_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")


yaml_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=12)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=3)),
                           max_leaves=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(QUICKSTART) + ["extra"]), value=yaml_values)
def test_fuzzed_specs_are_valid_or_a_spec_error(key, value):
    try:
        parse_spec({**QUICKSTART, key: value}, "fuzz")
    except SpecError as exc:
        assert exc.problems and all(p for p in exc.problems)


@settings(max_examples=150, deadline=None)
@given(document=yaml_values)
def test_fuzzed_documents_are_valid_or_a_spec_error(document):
    try:
        parse_spec(document, "fuzz")
    except SpecError:
        pass


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=200))
def test_fuzzed_file_bytes_never_crash_the_loader(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "job.yaml"
    path.write_text(text)
    try:
        load_spec(path)
    except SpecError:
        pass


def test_the_cli_reports_a_bad_spec_without_a_traceback(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text(yaml.safe_dump({**QUICKSTART, "capacity": "cheap", "workers": {"nodes": -1}}))
    result = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "render", str(bad)], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "capacity: Input should be" in result.stderr and "workers.nodes" in result.stderr
