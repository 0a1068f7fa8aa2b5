"""Pulumi entry point (`pulumi up` runs this file). The composition root is trainforge.platform.components.program."""

from trainforge.platform.components.program import main

main()
