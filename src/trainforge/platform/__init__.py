"""The Kubernetes layer. Its subpackages live in the repository's `platform/` folder (setuptools maps each one).

This `__init__.py` lives here, not in `platform/`: a `platform/__init__.py` would shadow the standard library's
`platform` module for anything run from the repository root, and setuptools' editable finder cannot resolve a
namespace package nested inside the regular package `trainforge`.
"""
