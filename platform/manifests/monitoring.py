"""What the platform watches: trainer pods scraped (PodMonitor), alert rules for training (PrometheusRule), and a
Grafana dashboard for training jobs (a ConfigMap the Grafana sidecar loads).

The rules and panels query the runtime's own metrics (trainer/runtime/metrics.py: a test checks every `trainforge_*`
name against its registry) and, where named in EXTERNAL_METRICS, Kueue's and DCGM's. Objects carry the
`release: kube-prometheus-stack` label the chart's Prometheus selects them by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainforge import contract
from trainforge.stackconfig import MonitoringConfig

SELECTED = {"release": contract.PROMETHEUS_RELEASE}
TRAINER_PODMONITOR = contract.TRAINER_PODMONITOR
RULES_NAME = "trainforge-training"
DASHBOARD_NAME = "trainforge-training-dashboard"
# Metrics the rules and the dashboard use that other software exports (name -> source).
EXTERNAL_METRICS = {
    "kueue_cluster_queue_resource_usage": "Kueue, metrics.enableClusterQueueResources (platform/manifests/values.py)",
    "kueue_cluster_queue_nominal_quota": "Kueue, metrics.enableClusterQueueResources",
    "DCGM_FI_DEV_GPU_UTIL": "dcgm-exporter's default counters",
}


# Per-scrape limits on a trainer pod: the runtime exposes about 150 series with 3-6 labels of short values (the
# test scrapes a real job against them). A pod exposing more fails its scrape (target down, an alert) instead of
# filling Prometheus, which would stop the budget controller's reads and so every budget hold.
TRAINER_SCRAPE_LIMITS = {"sampleLimit": 2000, "labelLimit": 12, "labelNameLengthLimit": 64, "labelValueLengthLimit": 256}


def trainer_metric_relabelings() -> list[dict[str, Any]]:
    """What a team cannot forge. Scraped labels never win over the target's (honorLabels false: a clash becomes
    `exported_<name>`), so `namespace` and `pod` are Kubernetes'; `team` is set from the namespace, over any value the
    pod sent; the runtime's `job` (the training job's name, which the scrape job's own `job` would shadow) is restored
    from `exported_job`; any other `exported_*` is dropped."""
    return [
        {"action": "replace", "sourceLabels": ["exported_job"], "regex": "(.+)", "targetLabel": "job", "replacement": "$1"},
        {"action": "replace", "sourceLabels": ["namespace"], "regex": f"{contract.TEAM_NAMESPACE_PREFIX}(.+)",
         "targetLabel": "team", "replacement": "$1"},
        {"action": "labeldrop", "regex": "exported_.+"},
    ]


# Prometheus-wide ceilings on every scrape (kube-prometheus-stack prometheusSpec.enforced*): a ServiceMonitor or
# PodMonitor whose own limits are looser, or that has none (the charts' own: dcgm-exporter's cannot set any), is held
# to these. Sized well above what the platform's exporters send (kube-state-metrics and the kubelet's cAdvisor are the
# largest: thousands of series per target on a busy node) and far below what fills Prometheus.
PROMETHEUS_SCRAPE_LIMITS = {"enforcedSampleLimit": 100000, "enforcedLabelLimit": 30, "enforcedLabelNameLengthLimit": 128,
                            "enforcedLabelValueLengthLimit": 2048}
# The pod labels dcgm-exporter copies onto GPU series (kubernetes.podLabelAllowlistRegex): the training job's name and
# its node index, nothing a pod could use to pass as another team (team comes from the namespace, below).
DCGM_POD_LABELS = (contract.LABEL_JOB, "batch.kubernetes.io/job-completion-index")


def dcgm_metric_relabelings() -> list[dict[str, Any]]:
    """GPU series name the pod using the GPU in `exported_namespace` / `exported_pod` / `exported_container` (honorLabels
    false: the target's own namespace and pod, the exporter's, win the plain names). Those come from the kubelet's
    pod-resources API, not from the pod: they become `namespace`, `pod`, `container`; `team` is set from the namespace
    over anything scraped; every other `exported_*` is dropped."""
    return [
        *({"action": "replace", "sourceLabels": [f"exported_{name}"], "regex": "(.+)", "targetLabel": name, "replacement": "$1"}
          for name in ("namespace", "pod", "container")),
        {"action": "replace", "sourceLabels": ["namespace"], "regex": f"{contract.TEAM_NAMESPACE_PREFIX}(.+)",
         "targetLabel": "team", "replacement": "$1"},
        {"action": "labeldrop", "regex": "exported_.+"},
    ]


def trainer_pod_monitor() -> dict[str, Any]:
    """Every trainforge training pod in every namespace, scraped on its `metrics` port, with the labels a team could
    forge taken from Kubernetes (trainer_metric_relabelings) and the scrape bounded (TRAINER_SCRAPE_LIMITS)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {"name": TRAINER_PODMONITOR, "namespace": contract.NAMESPACE_MONITORING, "labels": dict(SELECTED)},
        "spec": {
            "namespaceSelector": {"any": True},
            "selector": {"matchExpressions": [{"key": contract.LABEL_JOB, "operator": "Exists"}]},
            "podMetricsEndpoints": [{"port": contract.METRICS_PORT_NAME, "honorLabels": False, "interval": "15s",
                                     "metricRelabelings": trainer_metric_relabelings()}],
            **TRAINER_SCRAPE_LIMITS,
        },
    }


KUEUE_MONITOR = "kueue-controller-manager"
# The Kueue chart's metrics Service (templates/manager/auth_proxy_service.yaml, `kueue.metricsService.labels`).
KUEUE_METRICS_SERVICE_LABELS = {"app.kubernetes.io/name": "kueue", "app.kubernetes.io/component": "metrics-service"}


def kueue_service_monitor() -> dict[str, Any]:
    """Kueue's controller metrics (quota and usage per ClusterQueue: the quota alert reads them). The chart's own
    ServiceMonitor (`enablePrometheus`) carries only the chart's labels, so the platform's Prometheus would never select
    it, and it would need the Prometheus operator's CRDs before Kueue's release; this one is ours, labelled for
    selection and created after those CRDs. The endpoint is the chart's: HTTPS with the pod's self-signed certificate,
    authorised by the scraper's token (kube-prometheus-stack's Prometheus may get /metrics)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": KUEUE_MONITOR, "namespace": contract.NAMESPACE_KUEUE, "labels": dict(SELECTED)},
        "spec": {"selector": {"matchLabels": dict(KUEUE_METRICS_SERVICE_LABELS)},
                 "endpoints": [{"port": "https", "scheme": "https", "path": "/metrics", "interval": "30s",
                                "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                                "tlsConfig": {"insecureSkipVerify": True}}]},
    }


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str

    def rule(self) -> dict[str, Any]:
        return {"alert": self.name, "expr": self.expr, "for": self.for_, "labels": {"severity": self.severity},
                "annotations": {"summary": self.summary}}


def alerts(cfg: MonitoringConfig) -> list[Alert]:
    by_job = "by (job, team)"
    return [
        Alert("TrainingJobStalled", f"max {by_job} (changes(trainforge_step[{cfg.stalled_after_minutes}m])) == 0",
              "1m", "warning", f"{{{{ $labels.job }}}} ({{{{ $labels.team }}}}) made no step progress for {cfg.stalled_after_minutes} minutes"),
        Alert("GPUUnderutilised", f"max {by_job} (max_over_time(trainforge_gpu_utilization_ratio[30m])) < {cfg.gpu_idle_below}",
              "0m", "warning", f"{{{{ $labels.job }}}} kept its GPUs under {cfg.gpu_idle_below:.0%} busy for 30 minutes"),
        Alert("CheckpointStale",
              f"max {by_job} (trainforge_step - trainforge_last_checkpoint_step) > 2 * max {by_job} (trainforge_checkpoint_interval_steps)",
              "5m", "warning", "{{ $labels.job }}: the newest checkpoint is more than twice its interval behind"),
        Alert("CheckpointUploadLagging", f"max {by_job} (trainforge_s3_upload_lag_seconds) > {cfg.s3_lag_minutes * 60}",
              "5m", "warning", f"{{{{ $labels.job }}}}: a checkpoint has waited over {cfg.s3_lag_minutes} minutes for S3"),
        Alert("TrainingJobPreempted", f"max {by_job} (trainforge_restarts) - max {by_job} (trainforge_restarts offset 1h) > 0",
              "0m", "info", "{{ $labels.job }} resumed from a checkpoint in the last hour (spot reclaim, eviction or lost worker)"),
        Alert("TrainingJobRestartsOften", f"max {by_job} (trainforge_restarts) - max {by_job} (trainforge_restarts offset 6h) >= 3",
              "0m", "warning", "{{ $labels.job }} restarted 3 or more times in 6 hours: check the spot market or the job"),
        Alert("TeamGPUQuotaNearlyExhausted",
              f'sum by (cluster_queue, flavor) (kueue_cluster_queue_resource_usage{{resource="{contract.RESOURCE_GPU}"}}) '
              f'/ sum by (cluster_queue, flavor) (kueue_cluster_queue_nominal_quota{{resource="{contract.RESOURCE_GPU}"}}) '
              f'>= {cfg.quota_nearly_used}',
              "15m", "info", f"{{{{ $labels.cluster_queue }}}} uses {cfg.quota_nearly_used:.0%} or more of its {{{{ $labels.flavor }}}} GPUs"),
    ]


def budget_alerts(cfg: MonitoringConfig) -> list[Alert]:
    """From the budget controller's metrics (trainer/controllers/budget.py): a team near and at its budget, and a controller that
    has stopped completing passes (OpenCost down, the API refusing it), which means budgets are not enforced."""
    used = "(max by (team) (trainforge_team_spent_usd) / max by (team) (trainforge_team_budget_usd))"
    stale_s = 3 * cfg.budget_every_minutes * 60
    return [
        Alert("TeamBudgetNearlySpent", f"({used} >= {cfg.budget_warning}) unless ({used} >= 1)", "0m", "warning",
              "team {{ $labels.team }} has spent {{ $value | humanizePercentage }} of its monthly budget"),
        Alert("TeamBudgetReached", f"{used} >= 1", "0m", "warning",
              "team {{ $labels.team }} reached its monthly budget: its queue is held until the month rolls over or the budget is raised"),
        Alert("BudgetControllerNotRunning",
              f"(time() - max(trainforge_budget_last_pass_timestamp_seconds) > {stale_s}) or absent(trainforge_budget_last_pass_timestamp_seconds)",
              "10m", "warning", f"budgets are not enforced: the budget controller has completed no pass for over {stale_s // 60} minutes "
              "(is OpenCost up?)"),
    ]


def prometheus_rule(cfg: MonitoringConfig) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": RULES_NAME, "namespace": contract.NAMESPACE_MONITORING, "labels": dict(SELECTED)},
        "spec": {"groups": [{"name": "trainforge.training", "rules": [a.rule() for a in alerts(cfg)]},
                            {"name": "trainforge.budget", "rules": [a.rule() for a in budget_alerts(cfg)]}]},
    }


def _panel(panel_id: int, title: str, exprs: dict[str, str], unit: str, x: int, y: int) -> dict[str, Any]:
    return {"id": panel_id, "type": "timeseries", "title": title, "datasource": {"type": "prometheus", "uid": "prometheus"},
            "gridPos": {"x": x, "y": y, "w": 12, "h": 8}, "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend} for i, (legend, expr) in enumerate(exprs.items())]}


PANELS: list[tuple[str, dict[str, str], str]] = [
    ("Throughput (samples/s)", {"{{job}}": 'max by (job) (trainforge_samples_per_second{job=~"$job"})'}, "short"),
    ("Throughput (tokens/s)", {"{{job}}": 'max by (job) (trainforge_tokens_per_second{job=~"$job"})'}, "short"),
    ("Model FLOPs utilisation (GPU token tasks)", {"{{job}}": 'max by (job) (trainforge_mfu{job=~"$job"})'}, "percentunit"),
    ("Training loss", {"{{job}}": 'max by (job) (trainforge_loss{job=~"$job"})'}, "short"),
    ("Eval metrics", {"{{job}} {{metric}}": 'max by (job, metric) (trainforge_eval_metric{job=~"$job"})'}, "short"),
    ("GPU utilisation", {"{{job}} (runtime)": 'avg by (job) (trainforge_gpu_utilization_ratio{job=~"$job"})',
                         "{{pod}} (DCGM)": "avg by (pod) (DCGM_FI_DEV_GPU_UTIL) / 100"}, "percentunit"),
    ("Step time p50 / p95", {"{{job}} p50": 'histogram_quantile(0.5, sum by (job, le) (rate(trainforge_step_seconds_bucket{job=~"$job"}[5m])))',
                             "{{job}} p95": 'histogram_quantile(0.95, sum by (job, le) (rate(trainforge_step_seconds_bucket{job=~"$job"}[5m])))'}, "s"),
    ("Checkpoint age", {"{{job}}": 'max by (job) (trainforge_last_checkpoint_age_seconds{job=~"$job"})'}, "s"),
    ("S3 upload lag", {"{{job}}": 'max by (job) (trainforge_s3_upload_lag_seconds{job=~"$job"})'}, "s"),
    ("Cost rate (USD/h)", {"{{job}}": 'sum by (job) (trainforge_node_price_usd_per_hour{job=~"$job"})',
                           "all jobs": "sum(trainforge_node_price_usd_per_hour)"}, "currencyUSD"),
    ("Restarts", {"{{job}}": 'max by (job) (trainforge_restarts{job=~"$job"})'}, "short"),
]


def dashboard() -> dict[str, Any]:
    panels = [_panel(i + 1, title, exprs, unit, x=12 * (i % 2), y=8 * (i // 2)) for i, (title, exprs, unit) in enumerate(PANELS)]
    return {
        "uid": "trainforge-training", "title": "trainforge: training jobs", "schemaVersion": 39, "version": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "tags": ["trainforge"],
        "templating": {"list": [{"name": "job", "type": "query", "label": "job", "multi": True, "includeAll": True, "allValue": ".*",
                                 "datasource": {"type": "prometheus", "uid": "prometheus"},
                                 "query": {"query": "label_values(trainforge_step, job)", "refId": "jobs"}, "refresh": 2}]},
        "panels": panels,
    }


def dashboard_config_map() -> dict[str, Any]:
    """Loaded by Grafana's dashboard sidecar (label grafana_dashboard=1, any namespace)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": DASHBOARD_NAME, "namespace": contract.NAMESPACE_MONITORING, "labels": {"grafana_dashboard": "1"}},
            "data": {"trainforge-training.json": json.dumps(dashboard(), indent=1)}}


def queried_expressions(cfg: MonitoringConfig) -> list[str]:
    """Every PromQL expression the rules and the dashboard evaluate."""
    return [a.expr for a in alerts(cfg) + budget_alerts(cfg)] + [expr for _, exprs, _ in PANELS for expr in exprs.values()] + \
        [dashboard()["templating"]["list"][0]["query"]["query"]]
