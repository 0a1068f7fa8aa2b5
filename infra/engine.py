"""Run a Pulumi program offline under Pulumi's mock engine, every registered resource recorded. The one module
that touches the engine's internals.

The mock engine is Pulumi's documented unit-test monitor (`pulumi.runtime.set_mocks`): the program runs
unchanged, every resource input goes through the provider SDK's types, and nothing leaves this machine.
`RecordingMocks` plays the part of the cloud only where a real provider would compute an output the
program reads back (a cluster endpoint, an OIDC issuer, an auto-generated name). The program is passed in
(the composition root lives in the platform layer, which this layer must not import).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pulumi
from pulumi.runtime import _depends_on as pulumi_depends_on
from pulumi.runtime import resource_cycle_breaker as pulumi_cycle_breaker
from pulumi.runtime import rpc as pulumi_rpc
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from trainforge import contract
from trainforge.stackconfig import CONFIG_KEY, read_stack_file

PROJECT = contract.PROJECT  # Pulumi.yaml's name
MOCK_ACCOUNT = "123456789012"
ORGANIZATION = "organization"  # what a self-managed backend (S3) calls every stack's organisation


@dataclass(frozen=True)
class RegisteredResource:
    type: str
    name: str
    id: str
    inputs: dict[str, Any]
    state: dict[str, Any]
    provider: str | None
    urn: str = ""
    parent: str = ""
    dependencies: frozenset[str] = frozenset()  # URNs it waits for: depends_on, and the resources its inputs come from
    aliases: tuple[str, ...] = ()  # the URNs it answers to besides its own (state it adopts instead of creating anew)
    retain_on_delete: bool = False  # the engine drops it from the state on delete or replace, leaving the cloud's object
    protect: bool = False  # the engine refuses to delete or replace it

    @property
    def tags(self) -> dict[str, str]:
        return self.inputs.get("tags") or {}


class RecordingMonitor(pulumi.runtime.mocks.MockMonitor):
    """The mock engine's monitor, also keeping what the engine would use to order creation and deletion."""

    def __init__(self, mocks: RecordingMocks):
        super().__init__(mocks)
        self._recording = mocks
        self._lock = threading.Lock()

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            with self._lock:
                self._recording.annotate(request.type, request.name, urn=response.urn, parent=request.parent,
                                         dependencies=frozenset(request.dependencies),
                                         aliases=tuple(self._alias_urn(request, a) for a in request.aliases),
                                         retain_on_delete=bool(request.retainOnDelete), protect=bool(request.protect))
        return response

    def ReadResource(self, request):  # a resource the program reads, not creates: a StackReference
        response = super().ReadResource(request)
        with self._lock:
            self._recording.annotate(request.type, request.name, urn=response.urn, parent=request.parent,
                                     dependencies=frozenset(request.dependencies))
        return response

    @staticmethod
    def _alias_urn(request: Any, alias: Any) -> str:
        """The URN an alias names, computed as the engine computes it: a whole URN as given; a spec from its parts, each
        defaulting to the resource's own. (The mock monitor's own URNs keep only the parent's last type: the two agree for
        a top-level parent, the only kind the program's aliases name.)"""
        if alias.urn:
            return alias.urn
        spec = alias.spec
        parent = "" if spec.noParent else (spec.parentUrn or request.parent)
        type_ = spec.type or request.type
        chain = [t for t in parent.split("::")[2].split("$") if t != "pulumi:pulumi:Stack"] if parent else []
        if chain:  # the engine qualifies a child's type with its parent's whole type chain (the root stack's left out)
            type_ = "$".join([*chain, type_])
        return "urn:pulumi:" + "::".join([spec.stack or pulumi.get_stack(), spec.project or pulumi.get_project(), type_,
                                          spec.name or request.name])


def _suffix(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:7]


class RecordingMocks(pulumi.runtime.Mocks):
    """Records every registration; returns the outputs a real AWS provider would compute."""

    def __init__(self, region: str = "us-east-1", referenced: dict[str, Evaluation] | None = None, account: str | None = None):
        self.region = region
        self.account = account or MOCK_ACCOUNT  # the stack's own where it names it (its ECR, ARNs): as `pulumi up` would see
        self.resources: list[RegisteredResource] = []
        self.referenced = referenced or {}  # other stacks' evaluations, by stack name: what a StackReference to one reads

    def stack_reference(self, stack: str) -> dict[str, Any]:
        """A StackReference's state: the referenced stack's outputs (the backend refuses a stack it does not have)."""
        short = stack.rsplit("/", 1)[-1]
        if short not in self.referenced:
            raise RuntimeError(f"unknown stack {stack!r}: the offline engine has the outputs of {sorted(self.referenced)}")
        evaluation = self.referenced[short]
        return {"name": stack, "outputs": evaluation.outputs, "secretOutputNames": sorted(evaluation.secret_outputs)}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        if args.typ == "pulumi:pulumi:StackReference":
            state = self.stack_reference(args.resource_id or args.name)
            self.resources.append(RegisteredResource(args.typ, args.name, args.resource_id or args.name, {"name": state["name"]},
                                                     state, args.provider))
            return state["name"], state
        state = {**args.inputs, **self._computed(args)}
        resource_id = f"{args.name}-{_suffix(args.name)}"
        self.resources.append(RegisteredResource(args.typ, args.name, resource_id, dict(args.inputs), state, args.provider))
        return resource_id, state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list]:
        if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            return {"userName": "AWS", "password": "mock-token", "authorizationToken": "QVdTOm1vY2s=",
                    "proxyEndpoint": f"https://{self.account}.dkr.ecr.{self.region}.amazonaws.com"}, []
        return {}, []

    def annotate(self, type_token: str, name: str, **fields: Any) -> None:
        for i in range(len(self.resources) - 1, -1, -1):
            if self.resources[i].type == type_token and self.resources[i].name == name:
                self.resources[i] = dataclasses.replace(self.resources[i], **fields)
                return

    def _computed(self, args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
        service = args.typ.split(":")[1].split("/")[0] if args.typ.startswith("aws:") else "pulumi"
        token = _suffix(args.name)
        out: dict[str, Any] = {"arn": f"arn:aws:{service}:{self.region}:{self.account}:{args.name}"}
        if "name" not in args.inputs:  # Pulumi auto-naming happens in the engine, not in the program
            out["name"] = f"{args.name}-{token}"
        if args.typ == "aws:eks/cluster:Cluster":
            out |= {
                "endpoint": f"https://{token.upper()}.gr7.{self.region}.eks.amazonaws.com",
                "certificateAuthority": {"data": "bW9jay1jYQ=="},
                "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/{token.upper()}"}]}],
                "vpcConfig": {**args.inputs.get("vpcConfig", {}), "clusterSecurityGroupId": f"sg-cluster{token}"},
                "arn": f"arn:aws:eks:{self.region}:{self.account}:cluster/{args.inputs.get('name', args.name)}",
            }
        elif args.typ == "aws:s3/bucket:Bucket":
            out["bucket"] = args.inputs.get("bucket") or f"{args.name}-{token}"
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            out["latestVersion"] = 1
        elif args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            out |= {"dnsName": f"fs-{token}.fsx.{self.region}.amazonaws.com", "mountName": token,
                    "arn": f"arn:aws:fsx:{self.region}:{self.account}:file-system/{args.name}-{token}"}
        elif args.typ == "docker-build:index:Image":  # the registry answers a push with the image's digest: of its content
            content = json.dumps([args.name, args.inputs.get("labels") or {}, args.inputs.get("buildArgs") or {}], sort_keys=True)
            digest = "sha256:" + hashlib.sha256(content.encode()).hexdigest()
            out |= {"digest": digest, "ref": f"{(args.inputs.get('tags') or [args.name])[0]}@{digest}"}
        elif args.typ == "aws:eks/nodeGroup:NodeGroup":  # EKS creates one Auto Scaling group per managed node group
            out["resources"] = [{"autoscalingGroups": [{"name": f"eks-{args.name}-{token}"}], "remoteAccessSecurityGroupId": ""}]
        elif args.typ == "random:index/randomPassword:RandomPassword":
            out["result"] = f"mock-{token}-" + "x" * max(0, int(args.inputs.get("length", 16)) - 13)
        elif args.typ == "aws:rds/instance:Instance":
            out |= {"address": f"{args.name}.{token}.{self.region}.rds.amazonaws.com", "port": args.inputs.get("port", 5432)}
        elif args.typ == "aws:ecr/repository:Repository":
            out["repositoryUrl"] = f"{self.account}.dkr.ecr.{self.region}.amazonaws.com/{args.inputs.get('name', args.name)}"
        elif args.typ == "aws:kms/key:Key":
            out["keyId"] = f"key-{token}"
        elif args.typ == "aws:ec2/eip:Eip":
            out["allocationId"] = f"eipalloc-{token}"
        return out


async def _resolve_depends_on(depends_on: Any) -> set[pulumi.Resource]:
    """pulumi/runtime/_depends_on.py `_resolve_depends_on` (pulumi 3.272.0), except that an entry that is already a
    Resource is taken as it is. Upstream wraps every entry in `Output.from_input` (an Output, its task and a
    contains_unknowns walk) and awaits it; `Output.from_input(resource)` has no resources and the resource as its
    value, so upstream adds exactly that resource. Outputs and awaitables in depends_on still take upstream's path."""
    if not depends_on:
        return set()
    if isinstance(depends_on, list) and all(isinstance(d, pulumi.Resource) for d in depends_on):
        return set(depends_on)
    outer = pulumi.Output._from_input_shallow(depends_on)
    all_deps = await outer.resources()
    for entry in await outer.future() or []:
        if isinstance(entry, pulumi.Resource):
            all_deps = all_deps | {entry}
            continue
        inner = pulumi.Output.from_input(entry)
        all_deps = all_deps | await inner.resources()
        direct = await inner.future()
        if direct is not None:
            all_deps.add(direct)
    return all_deps


_HAS_DEPENDENTS = "_trainforge_has_dependents"


def _declare_dependency(from_resource: pulumi.Resource, to_resource: pulumi.Resource) -> bool:
    """pulumi/runtime/resource_cycle_breaker.py `declare_dependency` (pulumi 3.272.0): records the edge
    from -> to unless it closes a cycle. Upstream walks everything reachable from `to` for every edge and copies
    `from`'s dependency set to add one. A path to -> ... -> from ends in an edge into `from`, so while nothing
    depends on `from` (the common case: it is the resource being registered) no edge can close a cycle and the
    walk is skipped; otherwise upstream's walk (`_reachable`) decides. The set grows in place (nothing holds it
    across an await: the walks are synchronous)."""
    if from_resource is to_resource:
        return False
    if getattr(from_resource, _HAS_DEPENDENTS, False) and pulumi_cycle_breaker._reachable(from_resource=to_resource, to_resource=from_resource):
        return False
    deps = vars(from_resource).get(pulumi_cycle_breaker._DEPENDENCIES_PROPERTY)
    if deps is None:
        setattr(from_resource, pulumi_cycle_breaker._DEPENDENCIES_PROPERTY, {to_resource})
    else:
        deps.add(to_resource)
    setattr(to_resource, _HAS_DEPENDENTS, True)
    return True


# The upstream functions the two above stand in for, as written in the SDK they were read from (sha256 of their source,
# first 16 hex digits). Another SDK's may do more: then upstream's run (slower on wide fan-ins, and correct).
UPSTREAM_SOURCES = {"_resolve_depends_on": "3ab4b3f9714876de", "declare_dependency": "8acf8b90a08af64a"}


def _source_digest(function: Callable) -> str:
    import inspect
    try:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return ""


@functools.lru_cache(maxsize=1)
def replacements_apply() -> bool:
    """Whether the installed SDK's functions are the ones the replacements were written against (read once per process:
    the installed SDK does not change under it)."""
    return (_source_digest(pulumi_depends_on._resolve_depends_on) == UPSTREAM_SOURCES["_resolve_depends_on"]
            and _source_digest(pulumi_cycle_breaker.declare_dependency) == UPSTREAM_SOURCES["declare_dependency"])


@contextlib.contextmanager
def _linear_dependency_resolution(enabled: bool = True) -> Iterator[None]:
    """For one evaluation, the two functions above in place of upstream's (rpc.py imports declare_dependency by
    name, so it is replaced there too); upstream's are back afterwards. Both cost O(edges^2)-ish on programs
    where many resources depend_on the same long lists (issue 24). Not applied (upstream's run) when disabled or
    when the installed SDK's functions are not the ones they were written against."""
    if not enabled or not replacements_apply():
        yield
        return
    saved = (pulumi_depends_on._resolve_depends_on, pulumi_rpc.declare_dependency, pulumi_cycle_breaker.declare_dependency)
    pulumi_depends_on._resolve_depends_on = _resolve_depends_on
    pulumi_rpc.declare_dependency = pulumi_cycle_breaker.declare_dependency = _declare_dependency
    try:
        yield
    finally:
        pulumi_depends_on._resolve_depends_on, pulumi_rpc.declare_dependency, pulumi_cycle_breaker.declare_dependency = saved


@dataclass
class Evaluation:
    environment: str
    resources: list[RegisteredResource]
    outputs: dict[str, Any] = field(default_factory=dict)
    secret_outputs: frozenset[str] = frozenset()
    seconds: float = 0.0

    def of_type(self, type_token: str) -> list[RegisteredResource]:
        return [r for r in self.resources if r.type == type_token]

    def by_urn(self, urn: str) -> RegisteredResource:
        return next(r for r in self.resources if r.urn == urn)

    def depends_on(self, resource: RegisteredResource, other: RegisteredResource) -> bool:
        """Whether the engine creates `other` before `resource` (directly or through a chain of dependencies)."""
        seen, todo = set(), list(resource.dependencies)
        while todo:
            urn = todo.pop()
            if urn == other.urn:
                return True
            if urn not in seen:
                seen.add(urn)
                todo += [d for r in self.resources if r.urn == urn for d in r.dependencies]
        return False

    def named(self, type_token: str, name: str) -> RegisteredResource:
        matches = [r for r in self.of_type(type_token) if r.name == name]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} {type_token} named {name!r}; have {[r.name for r in self.of_type(type_token)]}")
        return matches[0]


def evaluate(program: Callable[[], None], config: dict[str, Any], environment: str, mocks: RecordingMocks | None = None,
             *, sdk_shortcuts: bool = True) -> Evaluation:
    """Run `program` (a Pulumi program's entry function) for stack `environment` with `config` (a stack file's `config:` map).
    `sdk_shortcuts=False` runs the SDK's own dependency resolution (what the shortcuts must agree with)."""
    platform = config.get(CONFIG_KEY)
    given = platform if isinstance(platform, dict) else {}
    mocks = mocks or RecordingMocks(given.get("region", "us-east-1"), account=given.get("account_id"))
    pulumi_settings.ROOT.set(None)  # a fresh root stack per evaluation, so exports never leak between runs
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=environment, preview=False, monitor=RecordingMonitor(mocks),
                             organization=ORGANIZATION)
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()})
    pulumi_settings.SETTINGS.rpc_manager.clear()
    pulumi_settings.SETTINGS.outputs.clear()
    root = pulumi_settings.get_root_resource()
    if root is None:
        raise RuntimeError("the mock engine made no root stack resource")
    exports: dict[str, Any] = root.outputs  # type: ignore[attr-defined]  # the root is a pulumi Stack: its exports, filled by the program
    outputs: dict[str, Any] = {}
    secrets: set[str] = set()

    async def run() -> None:
        # Awaited here, not with one _sync_await per export: a nested _sync_await pads the event loop's ready queue
        # back to its length on entry with cancelled handles (pulumi/runtime/sync_await.py), and right after the
        # program that queue holds a handle for every task the program started, so each export cost O(resources).
        program()
        for name, value in exports.items():
            output = pulumi.Output.from_input(value)
            outputs[name] = await output.future()
            if await output.is_secret():
                secrets.add(name)

    started = time.perf_counter()
    with _linear_dependency_resolution(sdk_shortcuts):
        _sync_await(run_pulumi_func(run))
    return Evaluation(environment, mocks.resources, outputs, frozenset(secrets), time.perf_counter() - started)


def evaluate_stack_file(program: Callable[[], None], path: str | Path, mocks: RecordingMocks | None = None) -> Evaluation:
    """`program` run for a stack file, as `pulumi preview` would run it for that stack."""
    stack = read_stack_file(path)
    return evaluate(program, stack.config, stack.environment, mocks)
