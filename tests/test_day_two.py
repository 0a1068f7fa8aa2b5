"""Every `pulumi up` after the first, over the engine's records: the program evaluated as deployed and as changed, then
platform/plan/day_two.py's model of what the engine does between the two (create, update, replace, delete, matched by
URN or alias) and the cloud's rules it may break. Beside it, where each pod of the platform and of the teams may run,
by the autoscaler's own fit check against every node group's template."""

from __future__ import annotations

import copy
import dataclasses
import shutil

import pytest
from support.helm import is_hook
from support.evaluated import autoscaler_templates, deployable, evaluation_of, plain, program_manifests
from support.repo import REPO, STACK_FILES, STACKS

from trainforge import contract, nodes, versions
from trainforge.infra import registry
from trainforge.infra.iam import principal_key
from trainforge.platform.plan import day_two
from trainforge.stackconfig import CONFIG_KEY, read_stack_file

DEV = STACKS / "Pulumi.dev.yaml"
ALICE = "arn:aws:iam::111122223333:role/sso-alice"
CAROL = "arn:aws:iam::111122223333:role/research/sso-carol"

pytestmark = pytest.mark.slow


def evaluated(members: list[str]):
    """dev with its first team's members set, evaluated from the current directory (the image's build context)."""
    from trainforge.platform.components.offline import evaluate
    config = copy.deepcopy(deployable(DEV))
    config[CONFIG_KEY]["teams"][0]["members"] = members
    return evaluate(config, read_stack_file(DEV).environment)


@pytest.fixture(scope="module")
def deployed():
    return evaluated([ALICE, CAROL])


def entries_of(evaluation, principal: str) -> list:
    return [r for r in evaluation.of_type(day_two.ACCESS_ENTRY) if r.inputs["principalArn"] == principal]


# ---- team members -----------------------------------------------------------------------------------------------

def test_removing_a_member_deletes_only_their_access_entry(deployed):
    """[alice, carol] then [carol]: carol's entry keeps its name and URN (no replacement, which EKS would refuse while
    her old entry exists), alice's goes, and nothing else changes."""
    after = evaluated([CAROL])
    (carol_before,), (carol_after,) = entries_of(deployed, CAROL), entries_of(after, CAROL)
    assert carol_after.urn == carol_before.urn and principal_key(CAROL) in carol_after.name
    changes = day_two.changes(deployed, after)
    assert [(c.action, c.urn) for c in changes] == [("delete", entries_of(deployed, ALICE)[0].urn)], "\n".join(map(str, changes))
    assert day_two.problems(deployed, after) == []


def test_reordering_members_changes_nothing(deployed):
    assert day_two.changes(deployed, evaluated([CAROL, ALICE])) == []


def test_the_model_sees_a_positional_name_replace_another_members_entry(deployed):
    """Not vacuous: entries named by position (what releases up to 0.1.0 did) make carol's entry the one alice's was, a
    replacement EKS refuses."""
    import dataclasses
    after = evaluated([CAROL])

    def positional(evaluation):
        renamed: dict[str, str] = {}
        for r in evaluation.of_type(day_two.ACCESS_ENTRY):
            if "-member-" in r.name:
                prefix = r.urn.rsplit("-member-", 1)[0]
                renamed[r.urn] = f"{prefix}-member-{sum(u.startswith(prefix + '-member-') for u in renamed.values())}"
        return dataclasses.replace(evaluation, resources=[dataclasses.replace(r, urn=renamed.get(r.urn, r.urn), aliases=())
                                                          for r in evaluation.resources])
    problems = day_two.problems(positional(deployed), positional(after))
    assert [p.fact for p in problems] == ["one-entry-per-principal"], problems


def test_a_stack_deployed_with_positional_names_adopts_its_entries(deployed):
    """The first `up` with this release over a stack whose entries were named `<prefix>-<position>`: each entry answers
    to its old URN by alias, so nothing is replaced."""
    import dataclasses
    members = [r for r in deployed.of_type(day_two.ACCESS_ENTRY) if "-member-" in r.name]
    assert len(members) == 2 + sum(len(t["members"]) for t in deployable(DEV)[CONFIG_KEY]["teams"][1:])
    old_urn = {r.urn: r.aliases[0] for r in deployed.of_type(day_two.ACCESS_ENTRY)}
    assert all(u.rsplit("-", 1)[-1].isdigit() for u in old_urn.values())
    old = dataclasses.replace(deployed, resources=[dataclasses.replace(r, urn=old_urn.get(r.urn, r.urn), aliases=())
                                                   for r in deployed.resources])
    assert [c for c in day_two.changes(old, deployed) if c.type == day_two.ACCESS_ENTRY] == []


# ---- the runtime image --------------------------------------------------------------------------------------------

def image_of(evaluation):
    (image,) = evaluation.of_type(day_two.IMAGE)
    return image


def test_a_later_product_commit_pushes_a_new_tag_and_replaces_nothing_else(deployed, tmp_path, monkeypatch):
    """The next `up` from a checkout whose runtime code changed: the image gets a new content tag (the repository's tags
    are immutable: the old tag again would be refused), the pods that run it are updated to it, and nothing that does
    not run the image changes."""
    shutil.copy(REPO / "Pulumi.yaml", tmp_path / "Pulumi.yaml")  # the project, as a later checkout of it
    for entry in registry.IMAGE_CONTEXT:
        source = REPO / entry
        if source.is_dir():
            shutil.copytree(source, tmp_path / entry, ignore=shutil.ignore_patterns(*registry.CONTEXT_EXCLUDED))
        else:
            shutil.copy(source, tmp_path / entry)
    (tmp_path / "trainer" / "runtime" / "loop.py").write_text((REPO / "trainer/runtime/loop.py").read_text() + "\n# a later commit\n")
    monkeypatch.chdir(tmp_path)
    after = evaluated([ALICE, CAROL])
    before_tags, after_tags = image_of(deployed).inputs["tags"], image_of(after).inputs["tags"]
    assert before_tags != after_tags and not set(before_tags) & set(after_tags)
    version = PYPROJECT_VERSION()
    assert after_tags[0].endswith(":" + contract.content_image_tag(version, registry.context_digest(tmp_path)))
    assert day_two.problems(deployed, after) == []
    old_ref, new_ref = image_of(deployed).state["ref"], image_of(after).state["ref"]
    changes = day_two.changes(deployed, after)
    assert changes, "the image changed"
    for change in changes:
        assert change.action in ("update", "replace"), change
        if change.type == day_two.IMAGE:
            continue
        resource = next(r for r in after.resources if r.urn == change.urn)
        inputs = repr(plain(resource.inputs))  # a chart takes the image as repository, tag and digest apart
        assert new_ref.split("@")[1] in inputs and old_ref.split("@")[1] not in inputs, f"{change} does not run the image"
        if change.action == "replace":  # a Job runs once per input: the MLflow user Job, again on the new image
            assert change.type == day_two.JOB, change


def test_the_same_checkout_again_changes_nothing(deployed):
    assert day_two.changes(deployed, evaluated([ALICE, CAROL])) == []


def test_the_model_sees_a_tag_that_stays_while_the_content_changes(deployed):
    """Not vacuous: the version-only tag of releases up to 0.1.0, pushed again for other content, is refused."""
    import dataclasses
    image = image_of(deployed)
    fixed = {**image.inputs, "tags": [image.inputs["tags"][0].rsplit(":", 1)[0] + ":v0.1.0"]}
    old = dataclasses.replace(image, inputs=fixed)
    new = dataclasses.replace(image, inputs={**fixed, "labels": {contract.IMAGE_CONTEXT_LABEL: "0" * 64}})
    before = dataclasses.replace(deployed, resources=[old if r is image else r for r in deployed.resources])
    after = dataclasses.replace(deployed, resources=[new if r is image else r for r in deployed.resources])
    assert [p.fact for p in day_two.problems(before, after)] == ["immutable-tag"]


def test_the_build_context_is_what_the_dockerfile_copies_and_dockerignore_admits():
    """One list (IMAGE_CONTEXT): the Dockerfile copies each of its entries, .dockerignore admits exactly those, and
    nothing else the repository holds (tests, stacks, scripts, CI) is sent to the builder or changes the tag."""
    dockerfile = (REPO / "Dockerfile").read_text().splitlines()
    copied = {part for line in dockerfile if line.startswith("COPY ") for part in line.split()[1:-1]}
    assert copied == set(registry.IMAGE_CONTEXT) - {"Dockerfile"}
    ignore = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*" and {line[1:] for line in ignore if line.startswith("!")} == set(registry.IMAGE_CONTEXT)
    files = registry.context_files(REPO)
    assert not [f for f in files if f.parts[0] in ("tests", "stacks", "scripts", ".ci", "benchmarks") or "__pycache__" in f.parts]
    assert registry.context_digest(REPO) == registry.context_digest(REPO)


def test_the_build_context_is_the_project_wherever_the_program_is_evaluated(tmp_path, monkeypatch):
    """`pulumi up` runs in the project (the context stays "."); `trainforge plan` or a benchmark may run elsewhere, and
    then the checkout the package came from is the project."""
    monkeypatch.chdir(REPO)
    assert str(registry.project_root()) == "."
    monkeypatch.chdir(tmp_path)
    assert registry.project_root() == REPO


def PYPROJECT_VERSION() -> str:
    import tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


# ---- CRDs --------------------------------------------------------------------------------------------------------

CRD_PATCH = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinitionPatch"


def crd_facts(evaluation) -> tuple[dict, dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """Per release of the program: what its install creates, the kinds its chart's crds/ define, and the kinds CRDs
    among its templates define."""
    from support.helm import crd_sources, program_releases, rendered_program
    sources = {name: crd_sources(inputs) for name, inputs in program_releases(evaluation).items()}
    return rendered_program(evaluation)[0], {n: s[0] for n, s in sources.items()}, {n: s[1] for n, s in sources.items()}


def test_every_crd_moves_with_the_pinned_version_and_outlives_any_up(deployed):
    """Trainer's and JobSet's CRDs sit in their charts' crds/, which Helm installs once and never upgrades: the release
    skips them and the program applies them, kept if it ever stops declaring them. Kueue's are templates of its chart:
    they live as long as its release, which the engine never uninstalls. (On the code before: four problems, the Trainer
    release's crds/ and Kueue's release.)"""
    rendered, chart_crds, template_crds = crd_facts(deployed)
    assert {"trainer.kubeflow.org/TrainJob", "jobset.x-k8s.io/JobSet"} <= chart_crds["kubeflow-trainer"]
    assert {"kueue.x-k8s.io/ClusterQueue", "kueue.x-k8s.io/Workload"} <= template_crds["kueue"]
    assert "monitoring.coreos.com/Prometheus" in chart_crds[contract.PROMETHEUS_RELEASE]
    assert day_two.upgrades_own_crds(rendered[contract.PROMETHEUS_RELEASE]), "its chart's own pre-upgrade Job applies them"
    assert day_two.crd_problems(deployed, rendered, chart_crds, template_crds) == []


def test_the_model_sees_a_chart_left_to_install_its_crds_and_a_release_or_crd_the_engine_may_delete(deployed):
    """The program as it was: the Trainer's release with its chart's crds/, kube-prometheus-stack's without its upgrade
    Job, Kueue's release and the CRDs deletable."""
    rendered, chart_crds, template_crds = crd_facts(deployed)
    rendered = {**rendered, contract.PROMETHEUS_RELEASE: [o for o in rendered[contract.PROMETHEUS_RELEASE] if not is_hook(o)]}
    as_before = []
    for r in deployed.resources:
        if r.type == day_two.RELEASE and r.inputs["name"] in ("kubeflow-trainer", "kueue"):
            r = dataclasses.replace(r, inputs={k: v for k, v in r.inputs.items() if k != "skipCrds"}, retain_on_delete=False)
        elif r.type == CRD_PATCH:
            r = dataclasses.replace(r, retain_on_delete=False)
        as_before.append(r)
    found = day_two.crd_problems(dataclasses.replace(deployed, resources=as_before), rendered, chart_crds, template_crds)
    by_fact = {fact: sorted(p.resource.rsplit("::", 1)[-1] for p in found if p.fact == fact) for fact in {p.fact for p in found}}
    crds = sorted(r.name for r in deployed.of_type(CRD_PATCH))
    assert by_fact == {"crds-never-upgraded": sorted(["kubeflow-trainer", contract.PROMETHEUS_RELEASE]),
                       "crds-deleted-with-owner": sorted(["kueue", *crds])}, found


def test_the_program_applies_the_pinned_charts_crds_as_they_are(deployed):
    """What the program applies is what the pinned Trainer chart (and its JobSet subchart) carries: bumping the version
    without the packaged files fails here, as tests/test_versions.py fails for the schemas."""
    from support.helm import chart_crd_documents

    from trainforge.platform.manifests.crds import PATCH_FORCE
    applied = {r.inputs["metadata"]["name"]: plain(r.inputs) for r in deployed.of_type(CRD_PATCH)}
    shipped = {d["metadata"]["name"]: d for d in chart_crd_documents("kubeflow-trainer", versions.KUBEFLOW_TRAINER)}
    assert set(applied) == set(shipped) and len(shipped) == 4
    for name, crd in applied.items():
        assert crd["spec"] == shipped[name]["spec"], name
        annotations = dict(crd["metadata"]["annotations"])
        assert annotations.pop(PATCH_FORCE) == "true", "a cluster where Helm installed it is taken over, not refused"
        assert annotations == shipped[name]["metadata"].get("annotations", {}), name


def test_a_crd_the_program_stops_declaring_stays_in_the_cluster(deployed):
    """The next program without the CRDs (say, a future Trainer that moves them): the engine deletes the resources from
    its state and leaves every CRD, and every TrainJob, in the cluster. Had they not been retained, the model says so."""
    crds = deployed.of_type(CRD_PATCH)
    next_up = dataclasses.replace(deployed, resources=[r for r in deployed.resources if r.type != CRD_PATCH])
    assert sorted(c.urn for c in day_two.changes(deployed, next_up)) == sorted(c.urn for c in crds)
    assert day_two.problems(deployed, next_up) == []
    deletable = dataclasses.replace(deployed, resources=[dataclasses.replace(r, retain_on_delete=False) if r.type == CRD_PATCH else r
                                                         for r in deployed.resources])
    assert {(p.fact, p.resource) for p in day_two.problems(deletable, next_up)} == {("crds-deleted-with-owner", c.urn) for c in crds}


# ---- where pods land --------------------------------------------------------------------------------------------

def flavoured_templates(evaluation) -> list[tuple[str, nodes.NodeTemplate]]:
    """Each node group's autoscaler template (support.evaluated) with the flavour its labels name."""
    return [(t.labels[contract.LABEL_FLAVOUR], t) for t in autoscaler_templates(evaluation)]


def platform_pods(evaluation) -> list[tuple[str, dict]]:
    """Every pod template of the platform's workloads: the program's own objects and its charts' (hook Jobs included),
    node agents (DaemonSets) left out, they belong on every node."""
    from support import helm
    from trainforge.platform.plan.first_up import pod_templates
    rendered, _ = helm.rendered_program(evaluation)
    objects = program_manifests(evaluation) + [o for objs in rendered.values() for o in objs if helm.is_hook(o)]
    out = []
    for o in objects:
        name = f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
        if o["kind"] in ("Prometheus", "Alertmanager"):  # the operator's StatefulSet takes the placement from the spec
            out.append((name, o["spec"]))
        elif o["kind"] != "DaemonSet":
            out += [(name, pod["spec"]) for pod in pod_templates(o)]
    return out


def addon_pods(evaluation) -> list[tuple[str, dict]]:
    """The EKS add-ons' controller pods as their configuration values place them (their defaults where they say nothing)."""
    import json

    from trainforge.infra.cluster import ADDON_DEFAULT_TOLERATIONS
    out = []
    for addon in evaluation.of_type("aws:eks/addon:Addon"):
        config = json.loads(addon.inputs.get("configurationValues") or "{}")
        for path in ADDON_CONTROLLERS.get(addon.inputs["addonName"], ()):
            values = config
            for key in path:
                values = values.get(key, {})
            tolerations = values.get("tolerations") or ADDON_DEFAULT_TOLERATIONS[addon.inputs["addonName"]]
            out.append((f"add-on {addon.inputs['addonName']} {'.'.join(path) or 'deployment'}",
                        {"nodeSelector": values.get("nodeSelector"), "tolerations": tolerations}))
    return out


ADDON_CONTROLLERS = {"coredns": ((),), "aws-ebs-csi-driver": (("controller",),), "aws-fsx-csi-driver": (("controller",),)}


@pytest.mark.parametrize("path", STACK_FILES, ids=[p.name for p in STACK_FILES])
def test_no_platform_pod_fits_a_team_node(path):
    """Team nodes hold teams' pods alone: every platform pod (charts, hook Jobs, the program's own, the add-ons'
    controllers) is refused by each tenant group's template for its labels or taints, and fits a system group."""
    evaluation = evaluation_of(path)
    templates = flavoured_templates(evaluation)
    tenant = [t for flavour, t in templates if flavour != contract.Flavour.SYSTEM.value]
    system = [t for flavour, t in templates if flavour == contract.Flavour.SYSTEM.value]
    assert tenant and system
    pods = platform_pods(evaluation) + addon_pods(evaluation)
    assert len(pods) > 20 and any(name.startswith("add-on coredns") for name, _ in pods)
    for name, pod in pods:
        shape = nodes.PodShape.of_pod_spec(pod, {})
        for node in tenant:
            reasons = nodes.fit_problems(shape, node)
            assert reasons, f"{name} could land on team node group {node.group}"
        assert nodes.scale_up_candidates(shape, system), f"{name} fits no system node group"


def test_the_team_cpu_nodes_are_tainted_and_their_flavour_says_so():
    """The taint the CPU group carries is the one Kueue's cpu ResourceFlavor names (so admitted pods tolerate it) and the
    one rendered CPU jobs tolerate."""
    evaluation = evaluation_of(DEV)
    (cpu,) = [t for flavour, t in flavoured_templates(evaluation) if flavour == contract.Flavour.CPU.value]
    assert nodes.Taint(contract.TAINT_TEAM_CPU, "true", "NoSchedule") in cpu.taints
    (group,) = [g for g in evaluation.of_type("aws:eks/nodeGroup:NodeGroup") if g.inputs["labels"][contract.LABEL_FLAVOUR] == "cpu"]
    assert {"key": contract.TAINT_TEAM_CPU, "value": "true", "effect": "NO_SCHEDULE"} in group.inputs["taints"]
