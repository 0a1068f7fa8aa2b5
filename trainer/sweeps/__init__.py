"""Hyperparameter sweeps: trials are real training jobs (spec.py: the sweep spec; controller.py: the study and its trials; report.py: plots)."""
