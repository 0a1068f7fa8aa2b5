"""Run a Pulumi program offline under Pulumi's mock engine, every registered resource recorded. The one module
that touches the engine's internals.

The mock engine is Pulumi's documented unit-test monitor (`pulumi.runtime.set_mocks`): the program runs
unchanged, every resource input goes through the provider SDK's types, and nothing leaves this machine.
`RecordingMocks` plays the part of the cloud only where a real provider would compute an output the
program reads back (a cluster endpoint, an OIDC issuer, an auto-generated name). The program is passed in
(the composition root lives in the platform layer, which this layer must not import).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pulumi
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from trainforge.stackconfig import CONFIG_KEY, read_stack_file

PROJECT = "trainforge"
MOCK_ACCOUNT = "123456789012"


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
                                         dependencies=frozenset(request.dependencies))
        return response


def _suffix(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:7]


class RecordingMocks(pulumi.runtime.Mocks):
    """Records every registration; returns the outputs a real AWS provider would compute."""

    def __init__(self, region: str = "us-east-1"):
        self.region = region
        self.resources: list[RegisteredResource] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        state = {**args.inputs, **self._computed(args)}
        resource_id = f"{args.name}-{_suffix(args.name)}"
        self.resources.append(RegisteredResource(args.typ, args.name, resource_id, dict(args.inputs), state, args.provider))
        return resource_id, state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list]:
        if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            return {"userName": "AWS", "password": "mock-token", "authorizationToken": "QVdTOm1vY2s=",
                    "proxyEndpoint": f"https://{MOCK_ACCOUNT}.dkr.ecr.{self.region}.amazonaws.com"}, []
        return {}, []

    def annotate(self, type_token: str, name: str, **fields: Any) -> None:
        for i in range(len(self.resources) - 1, -1, -1):
            if self.resources[i].type == type_token and self.resources[i].name == name:
                self.resources[i] = dataclasses.replace(self.resources[i], **fields)
                return

    def _computed(self, args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
        service = args.typ.split(":")[1].split("/")[0] if args.typ.startswith("aws:") else "pulumi"
        token = _suffix(args.name)
        out: dict[str, Any] = {"arn": f"arn:aws:{service}:{self.region}:{MOCK_ACCOUNT}:{args.name}"}
        if "name" not in args.inputs:  # Pulumi auto-naming happens in the engine, not in the program
            out["name"] = f"{args.name}-{token}"
        if args.typ == "aws:eks/cluster:Cluster":
            out |= {
                "endpoint": f"https://{token.upper()}.gr7.{self.region}.eks.amazonaws.com",
                "certificateAuthority": {"data": "bW9jay1jYQ=="},
                "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/{token.upper()}"}]}],
                "vpcConfig": {**args.inputs.get("vpcConfig", {}), "clusterSecurityGroupId": f"sg-cluster{token}"},
                "arn": f"arn:aws:eks:{self.region}:{MOCK_ACCOUNT}:cluster/{args.inputs.get('name', args.name)}",
            }
        elif args.typ == "aws:s3/bucket:Bucket":
            out["bucket"] = args.inputs.get("bucket") or f"{args.name}-{token}"
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            out["latestVersion"] = 1
        elif args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            out |= {"dnsName": f"fs-{token}.fsx.{self.region}.amazonaws.com", "mountName": token,
                    "arn": f"arn:aws:fsx:{self.region}:{MOCK_ACCOUNT}:file-system/{args.name}-{token}"}
        elif args.typ == "docker-build:index:Image":  # the registry answers a push with the image's digest
            digest = "sha256:" + hashlib.sha256(args.name.encode()).hexdigest()
            out |= {"digest": digest, "ref": f"{(args.inputs.get('tags') or [args.name])[0]}@{digest}"}
        elif args.typ == "aws:eks/nodeGroup:NodeGroup":  # EKS creates one Auto Scaling group per managed node group
            out["resources"] = [{"autoscalingGroups": [{"name": f"eks-{args.name}-{token}"}], "remoteAccessSecurityGroupId": ""}]
        elif args.typ == "random:index/randomPassword:RandomPassword":
            out["result"] = f"mock-{token}-" + "x" * max(0, int(args.inputs.get("length", 16)) - 13)
        elif args.typ == "aws:rds/instance:Instance":
            out |= {"address": f"{args.name}.{token}.{self.region}.rds.amazonaws.com", "port": args.inputs.get("port", 5432)}
        elif args.typ == "aws:ecr/repository:Repository":
            out["repositoryUrl"] = f"{MOCK_ACCOUNT}.dkr.ecr.{self.region}.amazonaws.com/{args.inputs.get('name', args.name)}"
        elif args.typ == "aws:kms/key:Key":
            out["keyId"] = f"key-{token}"
        elif args.typ == "aws:ec2/eip:Eip":
            out["allocationId"] = f"eipalloc-{token}"
        return out


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


def evaluate(program: Callable[[], None], config: dict[str, Any], environment: str, mocks: RecordingMocks | None = None) -> Evaluation:
    """Run `program` (a Pulumi program's entry function) for stack `environment` with `config` (a stack file's `config:` map)."""
    platform = config.get(CONFIG_KEY)
    mocks = mocks or RecordingMocks(platform.get("region", "us-east-1") if isinstance(platform, dict) else "us-east-1")
    pulumi_settings.ROOT.set(None)  # a fresh root stack per evaluation, so exports never leak between runs
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=environment, preview=False, monitor=RecordingMonitor(mocks))
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()})
    pulumi_settings.SETTINGS.rpc_manager.clear()
    pulumi_settings.SETTINGS.outputs.clear()
    root = pulumi_settings.get_root_resource()
    outputs: dict[str, Any] = {}
    secrets: set[str] = set()

    def run() -> None:
        program()
        for name, value in root.outputs.items():
            output = pulumi.Output.from_input(value)
            outputs[name] = _sync_await(output.future())
            if _sync_await(output.is_secret()):
                secrets.add(name)

    started = time.perf_counter()
    _sync_await(run_pulumi_func(run))
    return Evaluation(environment, mocks.resources, outputs, frozenset(secrets), time.perf_counter() - started)


def evaluate_stack_file(program: Callable[[], None], path: str | Path, mocks: RecordingMocks | None = None) -> Evaluation:
    """`program` run for a stack file, as `pulumi preview` would run it for that stack."""
    stack = read_stack_file(path)
    return evaluate(program, stack.config, stack.environment, mocks)
