"""The pack's policies, built from the rules declared in aws.py, kubernetes.py and stack.py (the
registry loads them), and the README's table of rules. Building the `PolicyPack` itself starts a gRPC server that never
returns, so only policies/__main__.py does that."""

from __future__ import annotations

from pulumi_policy import (Policy, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy, StackValidationArgs,
                           StackValidationPolicy)

from trainforge.policies.registry import CONFIG_SCHEMA, Rule, StackResource, check_resource, check_stack, rules


def _resource_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        provider = args.provider.props if args.provider is not None else {}
        for message in check_resource(rule, args.resource_type, args.props, name=args.name, config=args.get_config(), provider_props=provider):
            report(message, None)
    return ResourceValidationPolicy(name=rule.name, description=rule.description, validate=validate, enforcement_level=rule.level,
                                    config_schema=rule.config_schema())


def _stack_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        resources = [StackResource(r.resource_type, r.name, r.urn, r.props, r.provider.props if r.provider is not None else {},
                                   tuple(d.urn for d in r.dependencies)) for r in args.resources]
        for message, urn in check_stack(rule, resources, args.get_config()):
            report(message, urn)
    return StackValidationPolicy(name=rule.name, description=rule.description, validate=validate, enforcement_level=rule.level,
                                 config_schema=rule.config_schema())


POLICIES: list[Policy] = [_stack_policy(r) if r.is_stack_rule else _resource_policy(r) for r in rules()]


def rules_table() -> str:
    """The README's table: every rule of the pack, its level and what it checks; then the config."""
    lines = ["| rule | domain | level | what it checks |", "|---|---|---|---|"]
    lines += [f"| `{r.name}` | {r.domain} | {r.level.value} | {r.description} |" for r in rules()]
    lines += ["", "| config key | default | meaning |", "|---|---|---|"]
    lines += [f"| `{k}` | `{spec['default']}` | {spec['description']} |" for k, spec in CONFIG_SCHEMA.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(rules_table())
