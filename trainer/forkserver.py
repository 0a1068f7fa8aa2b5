"""A pre-imported interpreter that forks one real process per request: `python -m MODULE ARGV` without the import.

A training worker spends seconds of CPU importing torch and the runtime before its first step (2.3 s on one of these
2-core machines, 6 s on a slower one); a local sweep or the test suite starts hundreds of them. A fork server imports
the modules once, then for each request forks a child that becomes that invocation:

- its own pid, and a session and process group of its own (a cold worker shares its launcher's; a signal to the
  worker's group reaches only the worker, never the server or the process that started the server);
- the caller's stdin, stdout and stderr (passed over the socket), working directory, environment and argv;
- the module run as `python -m` runs it (`runpy`, as `__main__`), signal handlers back at their defaults;
- its end as an interpreter ends: non-daemon threads joined, atexit handlers run, streams flushed; its exit status (or
  the signal that killed it) reported to the caller as `subprocess.Popen.returncode` reports it.

What a fork cannot change is decided at the server's start: the interpreter's flags and whatever a library read from
the environment while it was imported (OpenMP's thread count, allocator settings, torch's logging). A request whose
environment differs from the server's in any such variable (IMPORT_TIME_ENV), or that names a module the server has
not imported (itself or as another's import), is answered `cold`, and the caller starts a fresh interpreter as it would without a server. So is every
request when the server is not there: a fork server only ever saves time, it never decides what runs.

A server listens on an abstract Unix socket (Linux: no file to leave behind when it is killed, no path length limit),
named `@trainforge-...` in the environment and in this module's functions; a filesystem path works too. An abstract
socket has no file permissions, so the server serves only connections from its own user (SO_PEERCRED): anyone else
could otherwise run code as that user.

Protocol, per connection: 8 ASCII digits of JSON length with three file descriptors attached (stdin, stdout, stderr),
then the JSON request {module, argv, env, cwd, tied}; the answer is `cold\\n`, or `pid <n>\\n` once the child exists and
`exit <code>\\n` when it has ended.

    python -m trainforge.trainer.forkserver ADDRESS MODULE [MODULE ...]

prints `ready` once it listens and serves until its stdin closes (whoever started it has ended) or it is terminated.
It must not touch CUDA or start threads before forking (both are lost in a fork): it only imports.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from trainforge.exits import EXIT_OK

# Read by the interpreter or by a library at import, so fixed in every child by the server's own start.
# LOGLEVEL: torch elastic's loggers (a forked torchrun); the last two: whether MLflow reports usage, settled at its import.
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_", "MALLOC_", "TORCH_LOGS", "TORCHDYNAMO_", "TORCHINDUCTOR_",
                   "LOGLEVEL", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")
READY = "ready"
COLD = "cold"


def import_time_env(environment: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if k.startswith(IMPORT_TIME_ENV)}


def supported() -> bool:
    """Linux only: abstract sockets, and a fork after importing torch is what Linux's multiprocessing does every day
    (macOS's system libraries refuse work in a forked child)."""
    return sys.platform == "linux"


def _socket_address(address: str) -> str:
    """`@name` is the abstract socket `\\0name` (an environment variable cannot hold a NUL); anything else a path."""
    return "\0" + address[1:] if address.startswith("@") else address


def _same_user(conn: socket.socket) -> bool:
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid == os.getuid()


# ---------------------------------------------------------------------------------------------------------- server


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, 8, 3)
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


def _exit_code(value: object) -> int:
    """What the interpreter exits with for `SystemExit(value)`: an int as is, None as 0, anything else printed, 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


# The signals whose handling the server and its session processes change, and a fresh interpreter's for each.
_SESSION_IGNORES = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _become_the_invocation(request: dict, fds: list[int], added: dict[str, str], ready: int) -> None:
    """In the forked child: take the invocation's session, signal handling, streams, directory, environment and argv,
    say so on `ready` (only then is its pid told, so nobody can signal it before it has its own process group and a
    fresh interpreter's handlers), run the module as `python -m` does, end as the interpreter ends. Never returns."""
    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.write(ready, b"1")
    os.close(ready)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    code = 0
    try:
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        os.environ.clear()
        os.environ.update({**added, **request["env"]})
        sys.argv = [request["module"], *request["argv"]]  # runpy puts the module's file in argv[0], as `python -m` does
        if not hasattr(sys.modules[request["module"]], "__path__"):
            # A plain module (torchrun's) runs as `__main__` only, as in a fresh interpreter: its imports stay warm, and
            # runpy does not warn that the module it runs was imported before.
            del sys.modules[request["module"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # the interpreter joins non-daemon threads before atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _answer_cold(conn: socket.socket, fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{COLD}\n".encode())


def _kill_group(child: int) -> None:
    try:
        os.killpg(child, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _caller_gone(conn: socket.socket) -> bool:
    """The connection is readable: EOF (or an error) means the caller is gone; a caller never writes after its request."""
    try:
        return not conn.recv(64)
    except OSError:
        return True


def _wait_for(child: int, conn: socket.socket) -> int:
    """A tied invocation's wait status. Its caller stands in for it (a proxy whose parent watches the proxy's pid):
    should the caller vanish first (SIGKILLed with its process group, as torchrun ends a worker it gave up on), the
    invocation's process group is killed as the caller's would have been, rather than left running unwatched."""
    try:
        pidfd = os.pidfd_open(child)
    except OSError:  # a kernel or seccomp profile without pidfds: look at the child twice a second instead
        pidfd = None
    try:
        while True:
            watched = [conn.fileno()] if pidfd is None else [pidfd, conn.fileno()]
            readable, _, _ = select.select(watched, [], [], None if pidfd is not None else 0.5)
            if pidfd is not None and pidfd in readable:
                break
            if pidfd is None:
                pid, status = os.waitpid(child, os.WNOHANG)
                if pid:
                    return status
            if conn.fileno() in readable and _caller_gone(conn):
                _kill_group(child)
                break
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return os.waitpid(child, 0)[1]


def _serve_one(conn: socket.socket, listener: socket.socket, server_env: dict[str, str], added: dict[str, str]) -> None:
    """In a forked session process: fork the invocation, say its pid, wait for it, say how it ended. It ignores the
    signals a terminal or a process-group kill sends its starter's group (Ctrl-C at `trainforge sweep`): it must
    outlive them to tell its caller how the invocation ended, or to kill a tied one whose caller is gone."""
    listener.close()
    for signum in _SESSION_IGNORES:
        signal.signal(signum, signal.SIG_IGN)
    child = 0
    told = False
    try:
        request, fds = _receive(conn)
        # As the child will see it: what the imports added, unless the request sets it (then a cold start's imports
        # would have read the request's value, and it must be the server's to fork).
        child_env = {**added, **request["env"]}
        if request["module"] not in sys.modules or import_time_env(child_env) != server_env or len(fds) != 3:
            _answer_cold(conn, fds)
            os._exit(EXIT_OK)
        ready, is_ready = os.pipe()
        child = os.fork()
        if child == 0:
            conn.close()
            os.close(ready)
            _become_the_invocation(request, fds, added, is_ready)
        os.close(is_ready)
        for fd in fds:
            os.close(fd)
        os.read(ready, 1)  # its own session and handlers first: a caller that knows the pid may signal it at once
        os.close(ready)
        conn.sendall(f"pid {child}\n".encode())
        told = True
        status = _wait_for(child, conn) if request.get("tied") else os.waitpid(child, 0)[1]
        conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:
        # The caller went away. One that never learned the pid (gone mid-request, or it gave up waiting and started
        # the invocation cold) must not have a second copy running; one that did ran it as an orphan would run (a
        # tied one was killed by _wait_for), and nobody is left to tell.
        if child and (not told or request.get("tied")):
            _kill_group(child)
    os._exit(EXIT_OK)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(address: str, modules: list[str]) -> None:
    before = dict(os.environ)
    for module in modules:
        __import__(module)
    if threading.active_count() != 1:
        raise RuntimeError(f"importing {modules} started threads ({threading.enumerate()}); a fork would lose them")
    # What the imports put in the environment (inductor's config sets its cache directory), a cold start's imports
    # would put there too: each child gets it unless its caller set it.
    added = {k: v for k, v in os.environ.items() if k not in before}
    server_env = import_time_env(dict(os.environ))  # as its imports read it, and what they added
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(_socket_address(address))
    listener.listen(64)
    try:
        print(READY, flush=True)
    except BrokenPipeError:  # whoever started us is gone before we were ready: nobody will ask
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor a traceback at exit for the unflushed line
        return
    signal.signal(signal.SIGTERM, lambda *_: os._exit(EXIT_OK))
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 5.0)
        _reap()
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return  # whoever started us is gone: nobody will ask again
        if listener in readable:
            conn, _ = listener.accept()
            if not _same_user(conn):
                conn.close()
                continue
            if os.fork() == 0:
                _serve_one(conn, listener, server_env, added)
            conn.close()


def start(modules: list[str], env: dict[str, str] | None = None, wait: bool = True) -> tuple[str, subprocess.Popen]:
    """Start a server that lives as long as this process (it reads EOF on its stdin, a pipe only we hold, when we
    end, however we end); return its address and process. With `wait`, return once it listens; without, at once: a
    request made before it listens finds nobody there and is run cold."""
    address = f"@trainforge-forkserver-{os.getpid()}-{secrets.token_hex(8)}"
    server = subprocess.Popen([sys.executable, "-m", __spec__.name, address, *modules], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    if wait:
        await_ready(server, modules)
    return address, server


def await_ready(server: subprocess.Popen, modules: list[str], timeout_s: float = 300) -> None:
    """Return once the server `start` started listens; RuntimeError (and the server killed) where it never will."""
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], timeout_s)
    line = server.stdout.readline() if ready else ""
    if line.strip() != READY:
        server.kill()
        raise RuntimeError(f"the fork server for {modules} did not start (said {line!r}, exit {server.poll()})")


# ---------------------------------------------------------------------------------------------------------- client


class ForkedProcess:
    """A forked invocation as its caller sees it: the parts of `subprocess.Popen` a launcher uses."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, pending: bytes):
        self.args, self._conn, self.pid, self._pending = args, conn, pid, pending
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._settle(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._settle(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def _settle(self, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and b"\n" not in self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._conn], [], [], left)
            if not readable:
                return None
            chunk = self._conn.recv(64)
            if not chunk:
                break
            self._pending += chunk
        if self.returncode is None:
            line = self._pending.decode()
            # No line: the server's session process was killed, and the child's status with it. A worker that left no
            # exit record reads as lost (retried), which is what a vanished process is.
            self.returncode = int(line.split()[1]) if line.startswith("exit ") else -signal.SIGKILL
            self._conn.close()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(address: str, module: str, argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None = None,
          fds: tuple[int, int, int] = (0, 1, 2), tied: bool = False) -> ForkedProcess | None:
    """`python -m MODULE ARGV` forked from the server at `address`; None where it must start cold (no server there, or
    the server cannot stand in for a fresh interpreter for this request). `tied`: the invocation's process group is
    killed when this caller vanishes before it ends (see _wait_for); untied, it runs to its end as an orphan would."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    received = b""
    try:
        conn.settimeout(30)
        conn.connect(_socket_address(address))
        payload = json.dumps({"module": module, "argv": argv, "env": env, "cwd": os.fspath(cwd or os.getcwd()),
                              "tied": tied}).encode()
        socket.send_fds(conn, [b"%08d" % len(payload)], list(fds))
        conn.sendall(payload)
        while b"\n" not in received:
            chunk = conn.recv(64)
            if not chunk:
                break
            received += chunk
    except OSError:
        conn.close()
        return None
    first, _, pending = received.partition(b"\n")
    if not first.startswith(b"pid "):
        conn.close()
        return None
    conn.settimeout(None)
    return ForkedProcess([sys.executable, "-m", module, *argv], conn, int(first.split()[1]), pending)


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # a `python -m` child sees its working directory first; each request sets its own
    serve(sys.argv[1], sys.argv[2:])
