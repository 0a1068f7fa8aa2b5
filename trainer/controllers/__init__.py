"""Services that run inside the cluster on the runtime image, each a loop over a pure decision: the budget controller
(budget.py: a team's month-to-date spend from OpenCost, and the hold on its ClusterQueue) and a cluster sweep's
controller (sweep.py: the reconcile loop of trainer/sweeps/controller.py, with its TrainJob as the status object)."""
