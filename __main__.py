"""Pulumi entry point (`pulumi up` runs this file). The program lives in trainforge.infra.program."""

from trainforge.infra.program import main

main()
