"""Thin Pulumi components that apply the Kubernetes layer, and the program's composition root (program.py)."""
