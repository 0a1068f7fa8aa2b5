"""Cluster-wide training objects the platform installs and every TrainJob relies on."""
