"""NetworkPolicies of the platform's own namespaces (issue 37): Kueue's, the training operators', monitoring, OpenCost
and trainforge's. Each namespace denies everything, then allows what its components need and nothing more: DNS and the
API server out, the API server's calls in (admission webhooks, Kueue's visibility API, the service proxy that `platform
verify` uses), Prometheus's scrapes in, Grafana's and OpenCost's queries to Prometheus, the budget controller's to
OpenCost. MLflow's namespace has its own (tracking.network_policies); the teams' are in tenancy.network_policies.

Two facts about EKS shape the rules (sources in tests/test_isolation.py):
- The API server calls webhooks and proxies from network interfaces EKS places in the cluster's subnets, the same ones
  pods use. No selector matches it, so its allowances are the VPC's range on the exact ports: any pod may then knock on
  those ports, but no team pod may leave its namespace for them (its own egress policies).
- The VPC CNI's policy agent sees a Service's ClusterIP, before translation, and admits it only when the Service's
  selector satisfies the rule's podSelector: an egress peer names a Service's pods by that Service's own selector keys.
Kubelet probes and `kubectl port-forward` are never filtered (traffic from the pod's own node), so Grafana's and
OpenCost's UIs stay reachable by port-forward with no rule. hostNetwork pods (node exporter) are outside every policy.
"""

from __future__ import annotations

from typing import Any

from trainforge import contract, kueue
from trainforge.platform.manifests import tenancy
from trainforge.stackconfig import PlatformConfig

MANAGED = {"app.kubernetes.io/part-of": "trainforge"}

# Pods as the charts label them, by the keys of the Service in front of each (see the module doc).
PROMETHEUS_PODS = {"app.kubernetes.io/name": "prometheus", "operator.prometheus.io/name": contract.PROMETHEUS_SERVICE_NAME}
ALERTMANAGER_PODS = {"app.kubernetes.io/name": "alertmanager", "alertmanager": f"{contract.PROMETHEUS_RELEASE}-alertmanager"}
GRAFANA_PODS = {"app.kubernetes.io/name": "grafana", "app.kubernetes.io/instance": contract.PROMETHEUS_RELEASE}
OPENCOST_PODS = {"app.kubernetes.io/name": "opencost", "app.kubernetes.io/instance": "opencost"}
BUDGET_PODS = {"app.kubernetes.io/name": contract.BUDGET_CONTROLLER}

PROMETHEUS_PORT = contract.PROMETHEUS_PORT
ALERTMANAGER_PORT = 9093
# What the API server calls, by the pods' own ports (a Service's targetPort): Kueue's webhooks and its visibility API
# (an APIService), the Trainer's and JobSet's webhooks, the Prometheus operator's (PrometheusRule admission).
WEBHOOK_PORT = 9443
KUEUE_VISIBILITY_PORT = 8082
PROMETHEUS_OPERATOR_PORT = 10250
# Kueue's metrics (HTTPS, a bearer token), scraped by the platform's ServiceMonitor (monitoring.kueue_service_monitor).
KUEUE_METRICS_PORT = 8443


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _namespace(name: str) -> dict[str, Any]:
    return {"matchLabels": {kueue.NAMESPACE_NAME_LABEL: name}}


def _policy(namespace: str, name: str, pods: dict[str, str] | None = None, *, ingress: list[dict[str, Any]] | None = None,
            egress: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One policy over the pods labelled `pods` (every pod of the namespace by default). A direction given, even empty,
    is governed: `ingress=[]` with `egress=[]` is the namespace's deny-all."""
    spec: dict[str, Any] = {"podSelector": {"matchLabels": dict(pods)} if pods else {}, "policyTypes": []}
    for direction, rules in (("Ingress", ingress), ("Egress", egress)):
        if rules is not None:
            spec["policyTypes"].append(direction)
            if rules:
                spec[direction.lower()] = rules
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED)}, "spec": spec}


def api_server_egress(cfg: PlatformConfig) -> dict[str, Any]:
    """Out to the API server: the `kubernetes` Service's address and, after translation, its private endpoint's."""
    return {"to": [{"ipBlock": {"cidr": cidr}} for cidr in tenancy.api_server_addresses(cfg)], "ports": _tcp(443)}


def from_control_plane(cfg: PlatformConfig, *ports: int) -> dict[str, Any]:
    """In from the API server (webhook calls, aggregated APIs, the service proxy), on exactly these ports."""
    return {"from": [{"ipBlock": {"cidr": str(cfg.network.vpc_cidr)}}], "ports": _tcp(*ports)}


def from_prometheus(*ports: int) -> dict[str, Any]:
    """In from Prometheus's pods, to be scraped: on these ports, or any where none are given."""
    rule: dict[str, Any] = {"from": [{"namespaceSelector": _namespace(contract.NAMESPACE_MONITORING), "podSelector": {"matchLabels": PROMETHEUS_PODS}}]}
    if ports:
        rule["ports"] = _tcp(*ports)
    return rule


def _to(namespace: str, pods: dict[str, str], *ports: int) -> dict[str, Any]:
    return {"to": [{"namespaceSelector": _namespace(namespace), "podSelector": {"matchLabels": dict(pods)}}], "ports": _tcp(*ports)}


def _baseline(cfg: PlatformConfig, namespace: str) -> list[dict[str, Any]]:
    """Deny all; every pod may resolve names and reach the API server (each component here is a controller or reads it,
    and RBAC, not the network, bounds what it may do there)."""
    return [_policy(namespace, "default-deny", ingress=[], egress=[]),
            _policy(namespace, "allow-dns-and-api-server", egress=[tenancy.dns_egress(), api_server_egress(cfg)])]


def kueue_system(cfg: PlatformConfig) -> list[dict[str, Any]]:
    ns = contract.NAMESPACE_KUEUE
    return [*_baseline(cfg, ns),
            _policy(ns, "allow-control-plane-in", ingress=[from_control_plane(cfg, WEBHOOK_PORT, KUEUE_VISIBILITY_PORT)]),
            _policy(ns, "allow-metrics-scrape", ingress=[from_prometheus(KUEUE_METRICS_PORT)])]


def training_operators(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The Trainer's and JobSet's controllers: webhooks only (their metrics are not scraped; the Trainer's status
    server is behind a feature gate that is off)."""
    ns = contract.NAMESPACE_TRAINER
    return [*_baseline(cfg, ns), _policy(ns, "allow-control-plane-in", ingress=[from_control_plane(cfg, WEBHOOK_PORT)])]


def monitoring(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Prometheus scrapes anything inside the cluster (pods in every namespace, the nodes' kubelets and exporters, the
    API server) and nothing outside it; everything here may be scraped by it. Grafana reaches Prometheus and
    Alertmanager, not the internet (its data source proxy would fetch for whoever can edit a data source). Alertmanager
    may reach HTTPS outside the cluster, where its receivers are."""
    ns = contract.NAMESPACE_MONITORING
    in_cluster = [{"ipBlock": {"cidr": cidr}} for cidr in tenancy.in_cluster_ranges(cfg)]
    return [*_baseline(cfg, ns),
            _policy(ns, "allow-control-plane-in", ingress=[from_control_plane(cfg, PROMETHEUS_OPERATOR_PORT, PROMETHEUS_PORT)]),
            _policy(ns, "allow-metrics-scrape", ingress=[from_prometheus()]),
            _policy(ns, "allow-prometheus-scrapes-the-cluster", PROMETHEUS_PODS, egress=[{"to": in_cluster}]),
            _policy(ns, "allow-prometheus-queries", PROMETHEUS_PODS, ingress=[{
                "from": [{"podSelector": {"matchLabels": GRAFANA_PODS}},
                         {"namespaceSelector": _namespace(contract.NAMESPACE_OPENCOST), "podSelector": {"matchLabels": OPENCOST_PODS}}],
                "ports": _tcp(PROMETHEUS_PORT)}]),
            # Prometheus's alerts arrive on the port it scrapes (allow-metrics-scrape); Grafana reads them there too.
            _policy(ns, "allow-grafana-to-alertmanager", ALERTMANAGER_PODS, ingress=[{
                "from": [{"podSelector": {"matchLabels": GRAFANA_PODS}}], "ports": _tcp(ALERTMANAGER_PORT)}]),
            _policy(ns, "allow-alertmanager-receivers", ALERTMANAGER_PODS, egress=[tenancy.https_out_of_cluster(cfg)]),
            _policy(ns, "allow-grafana-data-sources", GRAFANA_PODS, egress=[_to(ns, PROMETHEUS_PODS, PROMETHEUS_PORT),
                                                                             _to(ns, ALERTMANAGER_PODS, ALERTMANAGER_PORT)])]


def opencost(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """OpenCost reads Prometheus and AWS's public price list (HTTPS out); its API is read by Prometheus and the budget
    controller. Its UI and its MCP server are not opened to anyone (port-forward reaches them)."""
    ns = contract.NAMESPACE_OPENCOST
    return [*_baseline(cfg, ns),
            _policy(ns, "allow-prometheus-and-prices", OPENCOST_PODS, egress=[_to(contract.NAMESPACE_MONITORING, PROMETHEUS_PODS, PROMETHEUS_PORT),
                                                                              tenancy.https_out_of_cluster(cfg)]),
            _policy(ns, "allow-api-readers", OPENCOST_PODS, ingress=[
                from_prometheus(contract.OPENCOST_API_PORT),
                {"from": [{"namespaceSelector": _namespace(contract.NAMESPACE_SYSTEM), "podSelector": {"matchLabels": BUDGET_PODS}}],
                 "ports": _tcp(contract.OPENCOST_API_PORT)}])]


def trainforge_system(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The budget controller reads OpenCost and is scraped; the team-directory and quota Jobs need no network (Lustre
    is mounted by the node)."""
    ns = contract.NAMESPACE_SYSTEM
    return [*_baseline(cfg, ns),
            _policy(ns, "allow-budget-reads-opencost", BUDGET_PODS, egress=[_to(contract.NAMESPACE_OPENCOST, OPENCOST_PODS, contract.OPENCOST_API_PORT)]),
            _policy(ns, "allow-metrics-scrape", BUDGET_PODS, ingress=[from_prometheus(contract.BUDGET_METRICS_PORT)])]
