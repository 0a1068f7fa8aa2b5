"""Every cross-layer fact is spelled once (issue 23): a name other code must agree on — a Secret, a ServiceAccount, a
label, a tag, a file in a run directory — is a constant in its home (trainforge/contract.py, paths.py, run_tags.py,
exits.py),
and every other module imports it. Read from the source's syntax tree: a string literal anywhere in the product code
equal to a home's distinctive value is a second spelling, which a rename would silently leave behind.

Distinctive: a value with '-', '.', '/', '_' or ':' in it. Plain words ('team', 'run', 'mlflow') are facts too, but as
literals they are mostly dictionary keys and prose that happen to match; they are left to review. A real
coincidence is allowed below, with why.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from support.repo import REPO

HOMES = tuple(REPO / "src" / "trainforge" / name for name in ("contract.py", "paths.py", "run_tags.py", "exits.py"))
PRODUCT = ("src/trainforge", "trainer", "platform", "infra", "policies")
DISTINCTIVE = set("-./_:")

# (value, module) -> why that literal is not the home's fact.
COINCIDENCES = {
    ("cluster-autoscaler", "src/trainforge/stackconfig/kubernetes.py"): "the chart's name (charts a stack may re-pin)",
    ("cluster-autoscaler", "platform/manifests/charts.py"): "the chart's release and upstream name",
    ("cluster-autoscaler", "platform/components/kubernetes.py"): "the chart table's key (charts.py)",
    ("cluster-autoscaler", "platform/manifests/images.py"): "the chart table's key (charts.py)",
    ("kube-prometheus-stack", "src/trainforge/stackconfig/kubernetes.py"): "the chart's name (charts a stack may re-pin)",
    ("kube-prometheus-stack", "platform/manifests/charts.py"): "the upstream chart's own name",
    ("spent_usd", "trainer/cli/sweep.py"): "a key of the sweep status document, not the team settings' key",
    ("spent_usd", "trainer/sweeps/tracking.py"): "an MLflow metric of the sweep's run",
    ("spent_usd", "trainer/sweeps/targets.py"): "a key of `sweep status -o json` for a cluster sweep, not the team settings' key",
    ("trainforge-sweeps", "platform/manifests/sweeps.py"): "the app label of the database bootstrap objects",
}


@functools.cache
def product_modules() -> list[tuple[Path, str]]:
    """(path, its name from the repository root) of every product module, in order: what each check below reads."""
    return [(path, str(path.relative_to(REPO))) for folder in PRODUCT for path in sorted((REPO / folder).rglob("*.py"))]


@functools.cache
def syntax(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the checks."""
    return ast.parse(path.read_text())


def facts() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for home in HOMES:
        for node in ast.parse(home.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id.isupper() and DISTINCTIVE & set(node.value.value):
                        found.setdefault(node.value.value, []).append(f"{home.stem}.{target.id}")
    return found


def literals(path: Path):
    """(value, line) of every string literal that is not a docstring."""
    tree = syntax(path)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value, node.lineno


def test_every_distinctive_fact_is_spelled_in_its_home_only():
    known = facts()
    assert len(known) >= 30, "the homes' facts were read"
    second = []
    for path, module in product_modules():
        if path in HOMES:
            continue
        for value, line in literals(path):
            if value in known and (value, module) not in COINCIDENCES:
                second.append(f"{module}:{line} spells {value!r}, which is {' / '.join(known[value])}")
    assert second == [], "import the constant instead:\n" + "\n".join(second)


API_VERSION = re.compile(r"^[a-z0-9-]+(\.[a-z0-9-]+)+/v\d+((alpha|beta)\d+)?$")


def test_an_api_version_is_spelled_once_even_inside_a_path_or_split_in_two():
    """Issue 40, item 6: the scan above compares whole literals, so `f"/apis/kueue.x-k8s.io/v1beta2/..."` and
    `("kueue.x-k8s.io", "v1beta2")` escaped it (the Kueue API version was in five modules). An API version's group
    alone, or the version inside a longer string (an f-string's text included), is a second spelling too."""
    versions = {v: homes for v, homes in facts().items() if API_VERSION.match(v)}
    assert len(versions) >= 3, versions
    second = []
    for path, module in product_modules():
        if path in HOMES:
            continue
        for value, line in literals(path):
            for api, homes in versions.items():
                inside = re.search(rf"(?<![\w.-]){re.escape(api)}(?!\w)", value)  # not kubeflow.org/v1 in trainer.kubeflow.org/v1alpha1
                if value != api and (inside or value == api.rpartition("/")[0]):
                    second.append(f"{module}:{line} spells {value!r}, which holds {' / '.join(homes)}")
    assert second == [], "use the constant (contract.api_parts for its group and version):\n" + "\n".join(second)


def test_every_allowed_coincidence_is_still_there():
    """An allowance whose literal is gone is stale: it would excuse the next real second spelling."""
    present = {(value, module) for path, module in product_modules() for value, _ in literals(path)}
    assert [c for c in COINCIDENCES if c not in present] == []


def test_the_check_finds_a_second_spelling(tmp_path):
    """The scan is not vacuous: a retyped Secret name is found."""
    module = tmp_path / "retyped.py"
    module.write_text('"""A docstring naming trainforge-mlflow is prose."""\nNAME = "trainforge-mlflow"\n')
    assert [v for v, _ in literals(module) if v in facts()] == ["trainforge-mlflow"]


def test_the_error_messages_explain_the_name_pattern_the_models_use():
    """errors.py stays free of pydantic (the CLI's --help imports it), so it keys its explanation by the pattern's text."""
    from trainforge import errors, models
    assert models.DNS_LABEL in errors.PATTERN_MEANING


EXIT_CALLS = {"Exit", "exit", "_exit", "SystemExit"}  # typer.Exit, sys.exit, os._exit, SystemExit


def exit_literals(path: Path):
    """(code, line) of every exit code given as a number: an `exit_code=` keyword, or the argument of an exit call
    (either branch of a conditional included)."""
    def numbers(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            yield node.value
        elif isinstance(node, ast.IfExp):
            yield from numbers(node.body)
            yield from numbers(node.orelse)
    for node in ast.walk(syntax(path)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        given = [k.value for k in node.keywords if k.arg == "exit_code"] + (node.args[:1] if name in EXIT_CALLS else [])
        for value in given:
            for code in numbers(value):
                yield code, node.lineno


def test_every_exit_code_is_a_named_constant():
    """Issue 40, item 6: an exit code is a contract with the scripts, the job's restart rules and the tests (errors.py:
    the CLI's; exits.py: the runtime's). Spelled as a number (`typer.Exit(3)`, `exit_code=1`) it cannot be found when
    the contract changes."""
    found = [f"{module}:{line} exits with the number {code}" for path, module in product_modules() for code, line in exit_literals(path)]
    assert found == [], "name it (trainforge.errors.EXIT_*, trainforge.exits.EXIT_*):\n" + "\n".join(found)


def test_the_exit_code_check_sees_a_number(tmp_path):
    module = tmp_path / "exits.py"
    module.write_text("import typer\nraise typer.Exit(0 if ok else 3)\nraise Problem('', [], exit_code=1)\n")
    assert sorted(code for code, _ in exit_literals(module)) == [0, 1, 3]


PHASE_HOME = REPO / "trainer" / "backends" / "__init__.py"


def phase_literals(path: Path):
    """(phase, line) of every job phase written as its string where the code means a job's state: compared with
    something named state, given to a record's `.state` or its field's default, or to `_finish`. A tuple counts only when
    every item is a phase (`("running", "waiting")` is an Optuna trial's vocabulary, not a job's)."""
    from trainforge.trainer.backends import JobPhase
    phases = {p.value for p in JobPhase}

    def constants(node) -> list[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        values = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        return values if values and len(values) == len(items) and set(values) <= phases else []
    for node in ast.walk(syntax(path)):
        given: list[ast.AST] = []
        if isinstance(node, ast.Compare) and any("state" in ast.unparse(side) for side in (node.left, *node.comparators)):
            given = [node.left, *node.comparators]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = list(zip(target.elts, node.value.elts)) if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    else [(target, node.value)]
                given += [value for target_, value in pairs if isinstance(target_, ast.Attribute) and target_.attr == "state"]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "state" and node.value is not None:
            given = [node.value]
        elif isinstance(node, ast.Call) and "finish" in ast.unparse(node.func) and node.args:
            given = [node.args[0]]
        elif isinstance(node, ast.FunctionDef) and "state" in node.name:  # what a `..._state` function or property returns
            given = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
        for value in given:
            for phase in constants(value):
                yield phase, node.lineno


def test_a_job_phase_is_its_enum_member():
    """Issue 40, item 6: a job's state is a JobPhase (trainer/backends): the views, `check`, the controller and the local
    record compare against it. Written as a plain string beside it, a renamed or split phase leaves that spelling
    behind, matching nothing."""
    found = [f"{module}:{line} writes the phase {phase!r} as a string" for path, module in product_modules() if path != PHASE_HOME
             for phase, line in phase_literals(path)]
    assert found == [], "use trainforge.trainer.backends.JobPhase:\n" + "\n".join(found)


def test_the_phase_check_sees_a_string(tmp_path):
    module = tmp_path / "record.py"
    module.write_text("ACTIVE = 1\nif state.state == 'pending':\n    pass\nrecord.state, record.reason = 'failed', ''\n"
                      "class R:\n    state: str = 'running'\nself._finish('cancelled', 1, '')\ndef effective_state():\n    return 'lost'\n"
                      "if t['state'] not in ('running', 'waiting'):\n    pass\nif outcome == 'failed':\n    pass\n")
    assert sorted(phase for phase, _ in phase_literals(module)) == ["cancelled", "failed", "lost", "pending", "running"]


KEYS_HOME = REPO / "trainer" / "sweeps" / "keys.py"


def study_key_literals(path: Path):
    """(key, line) of every key of an Optuna study's or trial's user attrs written as a string where the code stores or
    reads one: `set_user_attr("k", ...)`, `...attrs.get("k")`, `...attrs["k"]`, `"k" in ...attrs`, `user_attrs={"k": ...}`,
    and a per-trial key built by hand (`f"trial.{n}.cost_usd"`)."""
    def attrs(node: ast.AST) -> bool:
        return ast.unparse(node).endswith("attrs")

    def text(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return ast.unparse(node)
        return None
    for node in ast.walk(syntax(path)):
        found: list[str | None] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "set_user_attr" or (node.func.attr == "get" and attrs(node.func.value)):
                found = [text(node.args[0])]
        if isinstance(node, ast.Call):
            found += [text(k) for kw in node.keywords if kw.arg == "user_attrs" and isinstance(kw.value, ast.Dict)
                      for k in kw.value.keys if k is not None]
        elif isinstance(node, ast.Subscript) and attrs(node.value):
            found = [text(node.slice)]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(attrs(c) for c in node.comparators):
            found = [text(node.left)]
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith("trial."):
            found = [ast.unparse(node)]
        for key in found:
            if key is not None:
                yield key, node.lineno


def test_every_key_a_sweep_stores_in_its_study_is_named_in_sweeps_keys():
    """Issue 40: what a sweep stores beside Optuna's own fields (the study's state, each trial's job and retry, the
    controller's per-trial facts) was spelled as strings at about 60 sites in 13 modules. Every sweep's database holds
    these names, so each is named once, in trainer/sweeps/keys.py."""
    found = [f"{module}:{line} spells the study key {key}" for path, module in product_modules() if path != KEYS_HOME
             for key, line in study_key_literals(path)]
    assert found == [], "use trainforge.trainer.sweeps.keys (StudyKey, TrialKey, fact_key):\n" + "\n".join(found)


def test_the_study_key_check_sees_a_string(tmp_path):
    module = tmp_path / "sweep.py"
    module.write_text("study.set_user_attr('spec', s)\nattrs = study.user_attrs\nattrs.get('cancelled')\nt.user_attrs['job']\n"
                      "if 'retry_of' in t.user_attrs:\n    pass\nstudy.enqueue_trial(p, user_attrs={'warm_start': o})\n"
                      "study.set_user_attr(f'trial.{n}.cost_usd', c)\nkey = f'trial.{n}.stopped'\nconfig.get('spec')\n")
    assert sorted({key for key, _ in study_key_literals(module)}) == \
        ["cancelled", "f'trial.{n}.cost_usd'", "f'trial.{n}.stopped'", "job", "retry_of", "spec", "warm_start"]


# ---- names built from parts: one function builds each (issue 40) -----------------------------------------------------

# A Pulumi resource's name under its parent's (`{}-mlflow`, `{}-team-{}`): unique within one component, read by no other layer.
CHILD_RESOURCE_NAME = re.compile(r"^\{\}(-[a-z]+)+(-\{\})?$")
# skeleton -> why it is built in more than one module.
SKELETON_COINCIDENCES = {
    "trainforge-{}": "a PriorityClass's name (contract) and a cluster's default name (stackconfig): two facts",
    "--nproc-per-node={}": "two programs' flags: the local backend calls trainforge's launcher, the launcher calls torchrun",
    "has(v.{})": "the policy looks for the clause in the CEL the guardrail wrote (policies import only the core)",
    "{}.dkr.ecr.{}.amazonaws.com/{}": "the mock engine answers as AWS would; the product builds the address it pulls from",
}


def skeletons(path: Path):
    """(skeleton, line) of every f-string that builds a name: its text with `{}` for each value, where the text has a
    separator of names ('-', '.', '/', ':', '_') and no space (a message is not a name)."""
    for node in ast.walk(syntax(path)):
        if not isinstance(node, ast.JoinedStr) or not any(isinstance(v, ast.FormattedValue) for v in node.values):
            continue
        text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
        skeleton = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        if len(text) >= 3 and " " not in skeleton and set(text) & DISTINCTIVE and not CHILD_RESOURCE_NAME.match(skeleton):
            yield skeleton, node.lineno


def test_a_name_built_from_parts_is_built_in_one_place():
    """Issue 40: a name two modules build with the same f-string (a stack file's, a checkpoint file's, an IRSA
    subject) is a fact spelled twice: a change to one leaves the other building the old name. Each has one function."""
    where: dict[str, set[str]] = {}
    for path, module in product_modules():
        for skeleton, _ in skeletons(path):
            where.setdefault(skeleton, set()).add(module)
    twice = {s: sorted(modules) for s, modules in where.items() if len(modules) > 1 and s not in SKELETON_COINCIDENCES}
    assert twice == {}, "build each in one function, in the fact's home"


def test_every_allowed_skeleton_coincidence_is_still_there():
    built = {s for path, _ in product_modules() for s, _ in skeletons(path)}
    assert sorted(set(SKELETON_COINCIDENCES) - built) == []


def test_the_skeleton_check_sees_a_built_name(tmp_path):
    module = tmp_path / "names.py"
    module.write_text("a = f'Pulumi.{stack}.yaml'\nb = f'{name}-mlflow'\nc = f'no {such} name'\nd = f'{x}'\n"
                      "e = f'system:serviceaccount:{ns}:{sa}'\n")
    assert sorted(s for s, _ in skeletons(module)) == ["Pulumi.{}.yaml", "system:serviceaccount:{}:{}"]


# ---- numbers other code must agree on: a uid, a port, a grace period (issue 40) ----------------------------------------

NUMBER_FIELDS = {"runAsUser", "runAsGroup", "fsGroup", "containerPort", "port", "targetPort", "terminationGracePeriodSeconds"}
# (module, field, value) -> why the literal is that module's own fact.
NUMBER_COINCIDENCES = {
    ("platform/manifests/storage.py", "runAsUser", 0): "root: the Lustre client mounts and chowns as root (this Job alone)",
    ("platform/manifests/storage.py", "runAsGroup", 0): "root, with runAsUser",
    ("platform/manifests/sweeps.py", "runAsUser", 70): "the postgres image's own user, for the psql bootstrap Job alone",
    ("platform/manifests/tenancy.py", "port", 53): "DNS",
    ("platform/manifests/tenancy.py", "port", 443): "HTTPS to the AWS endpoints",
    ("platform/manifests/values.py", "runAsUser", 65534): "nobody: the chart's directory Job (busybox) owns no file",
    ("platform/manifests/values.py", "runAsGroup", 65534): "nobody, with runAsUser",
}


def number_literals(path: Path):
    """(field, value, line) of every uid, port or grace period written as a number in a manifest (a dict's entry or a
    keyword argument of that name, in snake case too)."""
    snake = {re.sub(r"(?<!^)(?=[A-Z])", "_", f).lower(): f for f in NUMBER_FIELDS}
    for node in ast.walk(syntax(path)):
        pairs: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value in NUMBER_FIELDS]
        elif isinstance(node, ast.Call):
            pairs = [(snake.get(kw.arg, kw.arg), kw.value) for kw in node.keywords if kw.arg in snake or kw.arg in NUMBER_FIELDS]
        for field, value in pairs:
            if isinstance(value, ast.Constant) and isinstance(value.value, int) and not isinstance(value.value, bool):
                yield field, value.value, node.lineno


def test_a_uid_port_or_grace_period_is_a_named_constant():
    """Issue 40: `runAsUser: 1000` beside contract.RUNTIME_UID (the image's user), a port the network policies must
    open written again as a number: each is a fact other code agrees on, named once. A module's own number is allowed
    above, with why."""
    found = [f"{module}:{line} writes {field}: {value}" for path, module in product_modules()
             for field, value, line in number_literals(path) if (module, field, value) not in NUMBER_COINCIDENCES]
    assert found == [], "name it (contract, or the module that owns it) and use the name:\n" + "\n".join(found)


def test_every_allowed_number_is_still_there():
    written = {(module, field, value) for path, module in product_modules() for field, value, _ in number_literals(path)}
    assert sorted(set(NUMBER_COINCIDENCES) - written) == []


def test_the_number_check_sees_a_literal(tmp_path):
    module = tmp_path / "pod.py"
    module.write_text("pod = {'securityContext': {'runAsUser': 1000}, 'ports': [{'containerPort': 9400, 'name': 'metrics'}]}\n"
                      "k8s.V1SecurityContext(run_as_user=1000, privileged=False)\nrule = {'port': PORT}\n")
    assert sorted((f, v) for f, v, _ in number_literals(module)) == [("containerPort", 9400), ("runAsUser", 1000), ("runAsUser", 1000)]
