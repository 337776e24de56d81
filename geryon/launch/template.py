"""`--start fork`: ranks forked from a template process that has already imported torch.

A rank started the usual way (`--start exec`, the default) is a new interpreter that imports torch
before it runs a line of the script: about a CPU-second each on a small machine, which dominates a
short job (a sweep of tiny runs, a test suite). With `--start fork` the launcher imports torch and
geryon's server role once, forks a *template* process while it is still single-threaded (before the
rendezvous store or any output thread starts), and asks the template for each rank: the template
forks a child that takes the rank's environment, standard streams, argv and network namespace and
runs the script as `__main__`, as `python -u SCRIPT ARGS` would. PyTorch's DataLoader starts its
workers the same way (fork after `import torch`), so this is a well-trodden path; CUDA is never
initialised in the template.

What a forked rank shares with a fresh interpreter, and where it differs:
- the same: `sys.argv`, `sys.path[0]` (the script's directory), `__main__` (its `__name__`,
  `__file__`, pickling of its classes), the environment (`os.environ`, and the torch thread count
  from OMP_NUM_THREADS), warning filters as the launcher started with them, exit codes (SystemExit,
  an uncaught exception: 1, Ctrl-C: killed by SIGINT), non-daemon threads joined and `atexit`
  handlers run at exit, a new session (process group) per rank, SIGKILL when the launcher dies;
  Python's and numpy's global random generators are reseeded from the OS per rank.
- different: modules the launcher imported (torch, numpy, geryon) are not imported again, so
  variables those libraries read only at import time (e.g. TORCH_CPP_LOG_LEVEL) keep the launcher's
  values; interpreter options (`-X`, `-O`, PYTHONHASHSEED) are the launcher's; /proc/PID/cmdline and
  /proc/PID/environ show the launcher's (the kernel keeps what exec set), and the process name
  (/proc/PID/comm, `ps -o comm`, top) is the rank's: worker0, server1.

The template and the launcher talk over a private socketpair: a request is a JSON header with the
rank's three standard streams passed as descriptors (SCM_RIGHTS); the template answers with the pid
and, when a rank exits, with its exit code (negative: the signal that killed it, as Popen says).
"""

import atexit
import builtins
import ctypes
import fcntl
import importlib
import importlib.machinery
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
import types
import warnings
from contextlib import contextmanager

from geryon import envvars
from geryon.errors import LaunchError
from geryon.launch.orphans import exit_with_launcher
from geryon.launch.supervise import signal_group

MESSAGE_MAX = 1 << 20          # one request: the environment and argv of a rank
REPLY_MAX = 4096               # one answer: a pid or an exit code
PR_SET_NAME = 15
SERVER_ROLE = "geryon.runtime.server"   # a program to the launcher (rank_argv), run by name as `-m` would
# Imported once, in the launcher, for every rank: torch; torch._dynamo, which torch.optim's optimizers
# and DDP import on first use (most of a second again); geryon's rank API and server role.
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "numpy", "geryon.runtime.api",
           SERVER_ROLE)


def preload() -> None:
    """Import what every rank imports first, so that a forked rank finds it imported."""
    for name in PRELOAD:
        importlib.import_module(name)


class TemplateRank:
    """A rank forked by the template; the RankProcess the supervisor watches."""

    def __init__(self, spec, pid: int, stdout, stderr, template: "RankTemplate"):
        self.spec, self.pid, self.stdout, self.stderr = spec, pid, stdout, stderr
        self._template = template

    def poll(self) -> int | None:
        return self._template.exit_code(self.pid)

    @property
    def exit_order(self) -> int:
        """Where this rank's exit came among the template's ranks (the template reaps as they end)."""
        return self._template.exit_order(self.pid)

    def signal(self, signum: int) -> None:
        signal_group(self.pid, signum)


class RankTemplate:
    """The launcher's side: fork the template now, then `spawn` ranks from it; the template ends when
    the launcher closes its socket or exits (its ranks, if any are left, then get SIGKILL)."""

    def __init__(self):
        preload()
        self._warning_filters = list(warnings.filters)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        arm = exit_with_launcher()
        with warnings.catch_warnings():
            # torch's import leaves one idle native thread; nothing of it is used in the template.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:   # the template
            ours.close()
            code = 1
            try:
                arm()
                code = _serve(theirs, self._warning_filters)
            finally:
                os._exit(code)
        theirs.close()
        self.pid = pid
        self._sock = ours
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}   # pid -> exit code, in the order the ranks ended
        self.gone = False         # the template exited: its ranks were killed with it

    def spawn(self, spec, argv: list[str], env: dict[str, str], netns: str | None = None) -> TemplateRank:
        """Start a rank running `argv` (`[python, -u, SCRIPT, ARGS...]` or `[python, -u, -m, SERVER_ROLE]`)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        header = json.dumps({"argv": _script_argv(argv), "env": env, "netns": netns}).encode()
        try:
            with self._lock:
                socket.send_fds(self._sock, [header], [null, out_w, err_w])
                reply = self._receive_until(lambda message: "pid" in message or "error" in message)
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        if "error" in reply:
            os.close(out_r)
            os.close(err_r)
            raise LaunchError(f"cannot start {spec.name}: {reply['error']}")
        return TemplateRank(spec, reply["pid"], os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"), self)

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            while pid not in self._exits and not self.gone:
                if self._receive(block=False) is None:
                    return None
            return self._exits.get(pid, -signal.SIGKILL)

    def exit_order(self, pid: int) -> int:
        with self._lock:
            ended = list(self._exits)
            return ended.index(pid) if pid in self._exits else len(ended)

    def _receive_until(self, done) -> dict:
        while True:
            message = self._receive(block=True)
            if message is None:
                raise LaunchError("the rank template exited")
            if done(message):
                return message

    def _receive(self, block: bool) -> dict | None:
        self._sock.setblocking(block)
        try:
            data = self._sock.recv(REPLY_MAX)
        except BlockingIOError:
            return None
        if not data:
            self.gone = True
            return None
        message = json.loads(data)
        if "exit" in message:
            self._exits[message["exit"]] = message["code"]
        return message


_shared: "RankTemplate | None" = None


@contextmanager
def rank_template(config):
    """The launcher's RankTemplate under `--start fork` (else None).

    Forked once, at the first start of the job: before the rendezvous store, the emulated cluster or
    any library has started a thread or registered a fork handler (a handler registered later, e.g.
    by the store's event loop, would run again in every fork of the template and could close the
    descriptors a rank was just handed). A restarted job reuses it; it ends with the launcher."""
    global _shared
    if config.start != "fork":
        yield None
        return
    if _shared is None or _shared.gone:
        _shared = RankTemplate()
    yield _shared


def _script_argv(argv: list[str]) -> list[str]:
    """The rank's `sys.argv` from the command line exec would run: `-m SERVER_ROLE` or the script's."""
    args = [a for a in argv[1:] if a != "-u"]
    if args[:2] == ["-m", SERVER_ROLE]:
        return ["-m", SERVER_ROLE]
    if not args or args[0].startswith("-"):
        raise LaunchError(f"--start fork runs a script or geryon's server role, not {argv!r}")
    return args


def _serve(sock: socket.socket, warning_filters: list) -> int:
    """The template's loop: fork a rank per request, report exits; ends when the launcher hangs up."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)   # the launcher stops ranks itself; the template ends at EOF
    _keep_only_standard_streams_and(sock.fileno())
    template_pid = os.getpid()
    # A rank's exit wakes the loop at once (SIGCHLD through a wakeup pipe): the launcher learns of it
    # as soon as it would from waitpid on a child of its own.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                _drain(wake_r)
                continue
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_MAX, 3)
            if not data:
                return 0
            try:
                request = json.loads(data)
                pid = os.fork()
            except (ValueError, OSError) as exc:
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"error": str(exc)}).encode())
                continue
            if pid == 0:
                signal.set_wakeup_fd(-1)
                selector.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                sock.close()
                os._exit(_run_rank(request, fds, warning_filters, template_pid))
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"pid": pid}).encode())
        _report_exits(sock)


def _report_exits(sock: socket.socket) -> None:
    """Reap every rank that has ended and tell the launcher its exit code."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:   # no rank left
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _keep_only_standard_streams_and(keep: int) -> None:
    """Close what the launcher had open (as Popen's close_fds would for a rank); stdin, stdout: /dev/null."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:   # the listing's own descriptor
                pass
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        if fd != null:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _run_rank(request: dict, fds: list[int], warning_filters: list, template_pid: int) -> int:
    """In the forked child: become the rank, run it, exit as the interpreter would."""
    try:
        os.setsid()
        exit_with_launcher(template_pid)()   # SIGKILL when the template (and so the launcher) is gone
        _name_process(request["env"].get(envvars.RANK_NAME, ""))
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in fds]   # apart from 0-2, whatever they were
        for fd in fds:
            os.close(fd)
        for target, fd in enumerate(high):
            os.dup2(fd, target)
            os.close(fd)
        if request["netns"]:
            from geryon.netnames import enter_netns
            enter_netns(request["netns"])
        _take_environment(request["env"], warning_filters)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
    except BaseException:   # before the rank's code runs: what went wrong, on the rank's stderr
        traceback.print_exc()
        return 1
    return _exit_like_python(request["argv"])


def _name_process(name: str) -> None:
    """The rank's name (worker1, server0) as its process name: what `ps -o comm`, top and
    /proc/PID/comm show of a forked rank, whose command line is the launcher's."""
    if name:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _take_environment(env: dict[str, str], warning_filters: list) -> None:
    os.environ.clear()
    os.environ.update(env)
    for signum in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    warnings.filters[:] = warning_filters
    sys.path[:] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + \
        [p for p in sys.path[1:] if p]
    if env.get("PYTHONFAULTHANDLER"):
        import faulthandler
        faulthandler.enable()
    sys.modules["numpy"].random.seed()   # a fresh interpreter seeds numpy's global generator from the OS
    if env.get("OMP_NUM_THREADS", "").isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
        import torch
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


def _exit_like_python(argv: list[str]) -> int:
    """Run the rank's code; then what interpreter shutdown does: join threads, atexit, flush."""
    interrupted = False
    try:
        if argv[0] == "-m":   # as `python -m geryon.runtime.server` (already imported: no second copy)
            sys.argv = [SERVER_ROLE]
            sys.path.insert(0, os.getcwd())
            raise SystemExit(importlib.import_module(SERVER_ROLE).main())
        _script_as_main(argv)
        code = 0
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()   # the interpreter waits for non-daemon threads before atexit
    except BaseException:
        pass
    atexit._run_exitfuncs()
    main_module = sys.modules.get("__main__")
    if argv[0] != "-m" and getattr(main_module, "__file__", None) == argv[0]:
        main_module.__dict__.clear()   # as at shutdown: files the script left open are flushed and closed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:   # as CPython exits on an uncaught KeyboardInterrupt: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _script_as_main(argv: list[str]) -> None:
    """Execute the script as `__main__`, what `python SCRIPT ARGS` does."""
    path = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    exec(code, module.__dict__)


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1
