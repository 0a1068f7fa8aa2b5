"""A `trainforge` CLI interpreter that has paid the import cost once and forks one real process per invocation.

A cold `python -m trainforge.trainer.cli` spends about half a second importing typer, rich, pydantic and our modules
before it parses its arguments; the test suite runs it hundreds of times. This server imports the CLI once, then for
each request forks a child that becomes that invocation: its own pid, working directory, environment, argv, stdin from
/dev/null, stdout and stderr on the files the caller passed, the same `python -m` module run as `__main__`, and its
exit status (or the signal that killed it) reported by waitpid — what `subprocess.run` sees of a cold start.
tests/test_cli_forked.py proves both give the same exit code and output.

Run by tests/support/cli.py: `python forkserver.py SOCKET`; it prints `ready` once it listens, and serves until
its stdin closes (its client's process ended) or it is terminated.

Protocol, per connection: 8 bytes of JSON length with the two file descriptors (stdout, stderr) attached, then the JSON
request {argv, env, cwd}; the server answers `pid <n>\\n` once the child exists and `exit <code>\\n` when it has ended.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback

MODULE = "trainforge.trainer.cli"


def _preload() -> None:
    import trainforge.trainer.cli  # noqa: F401 - the import every cold start pays
    # Commands import these lazily; a child that needs them finds them already loaded.
    import trainforge.trainer.cli.sweep_cluster  # noqa: F401
    import trainforge.trainer.cli.sweep_views  # noqa: F401
    import trainforge.trainer.spec  # noqa: F401
    import trainforge.trainer.sweeps.spec  # noqa: F401
    import trainforge.stackconfig  # noqa: F401


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, 8, 2)
    while len(header) < 8:
        header += conn.recv(8 - len(header))
    size = int(header)
    payload = b""
    while len(payload) < size:
        chunk = conn.recv(size - len(payload))
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        payload += chunk
    return json.loads(payload), list(fds)


def _become_the_invocation(request: dict, out_fd: int, err_fd: int) -> None:
    """In the forked child: take the invocation's streams, directory, environment and argv, run the CLI module as
    `python -m` does, exit with its status. Never returns."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in (devnull, out_fd, err_fd):
        os.close(fd)
    code: int = 0
    try:
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [MODULE, *request["argv"]]  # runpy puts the module's file in argv[0], as `python -m` does
        runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _exit_code(value: object) -> int:
    """What the interpreter exits with for `SystemExit(value)`: an int as is, None as 0, anything else printed, 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _serve_one(conn: socket.socket, listener: socket.socket) -> None:
    """In a forked session process: fork the invocation, say its pid, wait for it, say its exit code."""
    listener.close()
    request, (out_fd, err_fd) = _receive(conn)
    child = os.fork()
    if child == 0:
        conn.close()
        _become_the_invocation(request, out_fd, err_fd)
    os.close(out_fd)
    os.close(err_fd)
    conn.sendall(f"pid {child}\n".encode())
    _, status = os.waitpid(child, 0)
    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    conn.close()
    os._exit(0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(path: str) -> None:
    sys.path[0] = os.getcwd()  # not this script's directory (tests/support): a `python -m` start sees its working directory
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 5.0)
        _reap()
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return  # the client's process is gone: nobody will ask again
        if listener in readable:
            conn, _ = listener.accept()
            if os.fork() == 0:
                _serve_one(conn, listener)
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
