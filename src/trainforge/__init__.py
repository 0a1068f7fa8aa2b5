"""trainforge: a GPU training platform on AWS and the tools researchers use on top of it.

Import map (one import root, see pyproject.toml):
  trainforge.contract   names that cross a layer boundary (labels, taints, flavours, tag keys, claim names)
  trainforge.catalog    instance types: GPUs per node, EFA interface layout
  trainforge.infra      the AWS layer (Pulumi) and its typed stack configuration
  trainforge.policies   CrossGuard rules (the pack itself is policies/__main__.py)
"""

__version__ = "0.1.0"
