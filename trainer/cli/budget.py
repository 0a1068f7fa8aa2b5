"""`trainforge budget run`: the cluster's budget controller (trainer/controllers/budget.py), as the platform deploys it."""

from __future__ import annotations

import typer

from trainforge.errors import EXIT_FAILED

app = typer.Typer(no_args_is_help=True, help="The monthly team budgets the cluster enforces (runs in the cluster).")


@app.command()
def run(once: bool = typer.Option(False, "--once", help="one pass, then exit: 0 done, 1 no cost data (nothing changed)"),
        every: int = typer.Option(300, min=30, help="seconds between passes"),
        opencost: str = typer.Option(None, help="OpenCost's API (default: the platform's in-cluster service)"),
        metrics_port: int = typer.Option(None, help="serve Prometheus metrics on this port (default: the contract's)"),
        context: str = typer.Option(None, help="kubeconfig context (in the cluster: the pod's service account)")) -> None:
    """Every pass: month-to-date cost per team from OpenCost -> spent/as-of in each team's ConfigMap; a team at its
    budget gets its ClusterQueue held, a held team under it (new month, raised budget) released. No data, no change."""
    import logging
    import signal
    import threading

    from trainforge import contract
    from trainforge.trainer.kube import Cluster
    from trainforge.trainer.controllers.budget import BudgetController, CostUnavailable, PrometheusMetrics

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if once:  # one pass has no one to scrape its metrics
        controller = BudgetController(Cluster(context), opencost or contract.OPENCOST_URL, None)
        try:
            decisions = controller.run_once()
        except CostUnavailable:
            raise typer.Exit(EXIT_FAILED) from None
        for d in decisions:
            typer.echo(f"{d.team}: {d.action} ({d.reason})")
        return
    metrics = PrometheusMetrics()
    controller = BudgetController(Cluster(context), opencost or contract.OPENCOST_URL, metrics)
    from prometheus_client import start_http_server
    start_http_server(metrics_port or contract.BUDGET_METRICS_PORT, registry=metrics.registry)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        try:
            controller.run_once()
        except CostUnavailable:
            pass  # logged; the next pass tries again
        except Exception:  # noqa: BLE001 - the API server blinking must not end the controller; the next pass retries
            logging.getLogger("trainforge.budget").exception("pass failed; nothing more was changed in it")
        stop.wait(every)
