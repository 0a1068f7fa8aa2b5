"""The researcher's side: the runtime inside every worker (runtime/) and, later, the CLI."""
