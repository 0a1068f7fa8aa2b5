"""The AWS layer: typed stack config (config.py, no pulumi import) and the Pulumi components built from it."""
