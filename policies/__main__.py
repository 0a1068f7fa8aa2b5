"""The trainforge policy pack: `pulumi preview --policy-pack policies`. Rules live in aws.py, kubernetes.py, stack.py."""

from pulumi_policy import PolicyPack

from trainforge.policies.pack import POLICIES

PolicyPack(name="trainforge", policies=POLICIES, description="trainforge guardrails for a GPU training platform on AWS")
