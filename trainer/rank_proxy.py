"""One torchrun worker forked from the warm worker interpreter: `python -m trainforge.trainer.rank_proxy MODULE ARGV`
stands where torchrun would start `python -m MODULE ARGV`.

torchrun starts each of a node's workers as a fresh interpreter, and each imports torch and the runtime before its
first step (5.5 s of CPU on these 2-core machines; a two-rank job pays it twice per attempt). Where the environment
names a worker fork server (launch.WORKER_FORKSERVER_ENV) the node launcher hands torchrun this module instead: a
small interpreter that imports nothing heavy, asks the server for the worker, and stands in for it towards torchrun:

- torchrun watches this process's pid: it ends as the worker ended, with its exit code, or killed by the signal that
  killed the worker (so torchrun's and the launcher's reading of "killed", "failed", "preempted" is unchanged);
- torchrun stops a worker by signalling the worker's process group: whatever reaches this process is passed on to
  the worker's own group (it has its own session, as torchrun gives every worker);
- SIGKILL cannot be passed on: the request is tied, so the server kills the worker's group when this process
  vanishes before the worker ends (forkserver._wait_for), where an untied forked worker would run on unwatched.

Where the server cannot stand in for a fresh interpreter (forkserver.spawn returns None), this process becomes the
worker by exec: the same pid, a cold start, as without a server. The cluster names no server: there, torchrun
starts its workers as it always does.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from typing import NoReturn

from trainforge.trainer import forkserver

# What torchrun (and a person at the terminal) send a worker; each is passed on to the worker's process group.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def interpreter_flags() -> list[str]:
    """The flags this interpreter was started with (`-u` from torchrun), for a cold start that must match them."""
    argv = sys.orig_argv
    return argv[1:argv.index("-m")] if "-m" in argv else []


def request_env(environment: dict[str, str]) -> dict[str, str]:
    """The worker's environment as the server compares it: `python -u` (torchrun's way) and PYTHONUNBUFFERED=1 (the
    server's) are the same setting of the interpreter, so `-u` reads as the variable."""
    if "-u" in interpreter_flags() and "PYTHONUNBUFFERED" not in environment:
        return {**environment, "PYTHONUNBUFFERED": "1"}
    return environment


def become_the_worker_cold(module: str, argv: list[str]) -> NoReturn:
    """Exec `python [flags] -m MODULE ARGV` in this process: what torchrun would have started."""
    os.execv(sys.executable, [sys.executable, *interpreter_flags(), "-m", module, *argv])


def end_as(code: int) -> NoReturn:
    """Exit as the worker did: its code, or the signal that killed it (default action, so the parent sees it)."""
    if code < 0:
        signum = -code
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset, nor can be blocked
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the worker's core file (SIGSEGV, SIGABRT) is the one to keep
        os.kill(os.getpid(), signum)
    sys.exit(code)


class StandIn:
    """The worker this process stands for, once it exists: a signal passed on to its process group; one that comes
    before it exists held, and passed on when it does."""

    def __init__(self) -> None:
        self.worker: forkserver.ForkedProcess | None = None
        self.held: list[int] = []
        for signum in FORWARDED:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame) -> None:
        if self.worker is None:
            self.held.append(signum)
        else:
            self._pass_on(self.worker, signum)

    @staticmethod
    def _pass_on(worker: forkserver.ForkedProcess, signum: int) -> None:
        try:
            os.killpg(worker.pid, signum)
        except ProcessLookupError:
            pass

    def adopt(self, worker: forkserver.ForkedProcess) -> None:
        self.worker = worker
        for signum in self.held:
            self._pass_on(worker, signum)

    def let_go(self) -> None:
        """No worker to stand for: the signals' default actions back, and one already held acted on now."""
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        if self.held:  # told to stop before anything started: as a cold worker told so at its start
            end_as(-self.held[0])


def main(argv: list[str]) -> NoReturn:
    if not argv:
        sys.exit("usage: python -m trainforge.trainer.rank_proxy MODULE [ARGV ...]")
    module, args = argv[0], argv[1:]
    from trainforge.trainer.launch import forked_worker
    stand_in = StandIn()
    worker = forked_worker([sys.executable, "-m", module, *args], request_env(dict(os.environ)), tied=True)
    if worker is None:
        stand_in.let_go()
        become_the_worker_cold(module, args)
    stand_in.adopt(worker)
    end_as(worker.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
