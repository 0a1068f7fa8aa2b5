"""The trainforge policy pack: `pulumi preview --policy-pack policies`. Rules live in policies/rules.py."""

from pulumi_policy import PolicyPack

from trainforge.policies.rules import POLICIES

PolicyPack(name="trainforge", policies=POLICIES)
