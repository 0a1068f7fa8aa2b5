"""Where the platform's third-party images come from: an ECR pull-through cache in the stack's own account where ECR can
cache the upstream registry, the upstream itself where it cannot.

A pull-through cache rule maps a prefix of the stack's registry to an upstream registry: the first pull of
`<registry>/<prefix>/<path>:<tag>` fetches the image from the upstream (through the NAT) into a repository ECR creates,
and every later pull, by any node, is served from ECR inside AWS. A node replaced at 3 a.m. then does not depend on
Docker Hub's rate limits or quay.io being up. The prefix here is the upstream's own host name, so a cached reference
reads as the upstream one behind the registry: `123456789012.dkr.ecr.us-east-1.amazonaws.com/quay.io/prometheus/prometheus:v3.5.0`.

ECR caches only the upstreams in ECR_UPSTREAMS (Amazon ECR user guide, "Sync an upstream registry with an Amazon ECR
private registry"); Docker Hub and GitHub's registry need a credential (a Secrets Manager secret), so they are cached
only where the stack gives one. NVIDIA's nvcr.io is not among them: the device plugin and the DCGM exporter are pulled
from it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection

# The image reference's host -> the upstream registry URL a pull-through cache rule names for it.
ECR_UPSTREAMS = {"public.ecr.aws": "public.ecr.aws", "registry.k8s.io": "registry.k8s.io", "quay.io": "quay.io",
                 "docker.io": "registry-1.docker.io", "ghcr.io": "ghcr.io"}
NEEDS_CREDENTIAL = frozenset({"docker.io", "ghcr.io"})
# Upstreams the platform pulls from that ECR cannot cache, and why: said where a stack's images are listed.
NOT_CACHEABLE = {"nvcr.io": "ECR pull-through cache does not support NVIDIA NGC (nvcr.io)"}


def cached_upstreams(enabled: bool, credentialed: Collection[str]) -> tuple[str, ...]:
    """The upstreams a stack caches: every supported one that needs no credential, and those it gives one for."""
    if not enabled:
        return ()
    return tuple(u for u in ECR_UPSTREAMS if u not in NEEDS_CREDENTIAL or u in credentialed)


def upstream_of(image: str) -> str:
    """The registry host of an image reference (`docker.io` where the reference names none, as a container runtime reads it)."""
    first, _, rest = image.partition("/")
    return first if rest and ("." in first or ":" in first or first == "localhost") else "docker.io"


def _joined(registry: Any, suffix: str) -> Any:
    return registry.apply(lambda host: f"{host}/{suffix}") if hasattr(registry, "apply") else f"{registry}/{suffix}"


@dataclass(frozen=True)
class ImageSources:
    """The stack's cache: its registry host (`<account>.dkr.ecr.<region>.amazonaws.com`, a Pulumi Output in the program;
    None without a cache) and the upstreams it caches."""

    registry: Any = None
    cached: frozenset[str] = frozenset()

    def registry_for(self, upstream: str) -> Any:
        """What a chart's `registry` value becomes for an image of `upstream`: the cache's path for it, or the upstream."""
        if self.registry is None or upstream not in self.cached:
            return upstream
        return _joined(self.registry, upstream)

    def image(self, reference: str) -> Any:
        """A whole image reference through the cache where its upstream is cached (Docker Hub's official images keep
        their `library/`, as ECR's cache names them)."""
        upstream = upstream_of(reference)
        if self.registry is None or upstream not in self.cached:
            return reference
        path = reference.split("/", 1)[1] if reference.startswith(f"{upstream}/") else reference
        if upstream == "docker.io" and "/" not in path:
            path = f"library/{path}"
        return _joined(self.registry, f"{upstream}/{path}")


NO_CACHE = ImageSources()
