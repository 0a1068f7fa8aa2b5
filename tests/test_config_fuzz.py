"""Whatever a stack file holds, the loader answers with a valid config or a ConfigError, never a crash."""

from __future__ import annotations

import copy

import yaml
from support.repo import STACKS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainforge.stackconfig import CONFIG_KEY, ConfigError, PlatformConfig, parse

BASE = yaml.safe_load((STACKS / "Pulumi.prod.yaml").read_text())["config"][CONFIG_KEY]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(BASE) if p]


def _replace(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=values)
def test_any_single_field_replaced_by_anything_is_valid_or_a_config_error(path, value):
    try:
        result = parse(_replace(BASE, path, value), environment="prod", source="fuzz")
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
    else:
        assert isinstance(result, PlatformConfig)


@settings(max_examples=100, deadline=None)
@given(document=values)
def test_any_document_is_valid_or_a_config_error(document):
    try:
        parse(document, environment="prod", source="fuzz")
    except ConfigError:
        pass
