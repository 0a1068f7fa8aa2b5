"""A sweep's study as a test reads it, often while the sweep runs: one optuna storage per database per test process.

Opening a storage (`trainforge.trainer.sweeps.study.storage_for`: an engine, optuna's schema check through Alembic)
costs about 0.1 s of CPU, reading the trials of an open one under 0.01 s. The waits that polled a running sweep five
times a second through a new storage each time kept a core a third busy (py-spy: 33 s of CPU in one test), slowing the
very trials they waited for on a two-core machine. A storage reads the database on every call (optuna caches only
finished trials, which never change), so one kept open sees what every other process writes.
"""

from __future__ import annotations

import optuna
import sqlalchemy

from trainforge.trainer.sweeps.study import load_existing, storage_for

_STORAGES: dict[str, optuna.storages.RDBStorage] = {}


def study(name: str, url: str) -> optuna.Study:
    """The study `name` in the database at `url`; until both exist, the product's own error (SweepError, a
    TrainforgeError) from load_existing, as a wait expects while a sweep is starting."""
    storage = _STORAGES.get(url)
    if storage is None:
        found = load_existing(name, url)
        try:
            _STORAGES[url] = storage_for(url)
        except sqlalchemy.exc.SQLAlchemyError:  # racing the sweep's own schema set-up (seen: alembic_version stamped
            pass  # twice); the study was found all the same, and the next call opens a storage again
        return found
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return load_existing(name, url)


def close_all() -> None:
    """Each storage's pooled connections closed (conftest, after every test): a test's database is its own."""
    for storage in _STORAGES.values():
        storage.engine.dispose()
    _STORAGES.clear()
