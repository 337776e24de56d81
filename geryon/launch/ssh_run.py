"""SSH backend: ranks run on the hostfile's hosts, started over SSH with paramiko.

Every host is connected to (and its key checked against known_hosts) before any rank starts: an
unknown or changed host key is a HostKeyError, never silently accepted. Each rank is one exec
channel running `cd CWD && read SECRET && exec env VARS... PYTHON SCRIPT ARGS`: the job secret is
never on a command line (which `ps` shows every user of the host, and sshd may log); the launcher
writes it as the first line of the channel's stdin, and the shell exports it. Under --tls the job's
TLS key and certificate follow the same way, base64 on the second line (GERYON_TLS_CREDENTIALS). The remote shell first
reports its PID, which sshd made a session (and process group) leader, so stopping a rank is `kill -SIG -- -PID`
on the same connection. The launcher hosts the TCPStore; ranks dial the address the launcher has
toward the first host.
"""

import os
import shlex
import socket
from contextlib import ExitStack

from geryon.envvars import JOB_SECRET, REMOTE_PID_MARK, TLS_CREDENTIALS, TLS_FILE
from geryon.errors import LaunchError, RemoteError
from geryon.launch.config import LaunchConfig
from geryon.launch.environment import job_environment, local_world_sizes, rank_argv
from geryon.launch.hostfile import HostSpec
from geryon.launch.orphans import SSH_RANK_REDIRECTS, SSH_WATCHER
from geryon.launch.placement import RankSpec, place_by_hostfile
from geryon.launch.rendezvous import hosted_store
from geryon.launch.supervise import JobResult, supervise
from geryon.netconf.remote import open_client
from geryon.signals import interrupts_deferred
from geryon.transport.tls import load_credentials

CONNECT_TIMEOUT_S = 15.0
PID_MARK = REMOTE_PID_MARK.encode()
NO_EXIT_STATUS = 255  # like ssh(1): the remote side ended without an exit status (signal, lost link)
SECRET_VARIABLE = JOB_SECRET


def run_job(config: LaunchConfig, out=None, err=None) -> JobResult:
    """Connect to every host, run the job there, stop what is left, disconnect."""
    specs = place_by_hostfile(config)
    sizes = local_world_sizes(specs)
    with ExitStack() as stack:
        clients = []
        for host in config.hosts:
            client = connect(host, config.known_hosts)
            stack.callback(client.close)
            clients.append(client)
        master_addr = address_toward(config.hosts[0])
        with hosted_store(master_addr) as port:
            def start(spec: RankSpec) -> "SshRank":
                host = config.hosts[spec.host]
                env = job_environment(config, spec, master_addr, port, sizes.get(spec.host, 0),
                                      host_ip=resolve(host), iface=host.iface)
                argv = rank_argv(config, spec, python=host.python)
                lines = [env.pop(SECRET_VARIABLE)]
                if TLS_FILE in env:      # the file is on this host: its content travels on stdin
                    lines.append(load_credentials(env.pop(TLS_FILE)).encoded())
                command = remote_command(argv, env, os.getcwd(), tls=len(lines) > 1)
                return SshRank(spec, clients[spec.host], command, host, stdin_line="\n".join(lines))

            try:
                return supervise(specs, start, config.grace, config.timeout, out, err)
            finally:
                with interrupts_deferred():
                    stack.close()


def connect(host: HostSpec, known_hosts: str):
    """An authenticated paramiko SSHClient for `host`, its key verified against `known_hosts`."""
    try:
        return open_client(host.host, host.port, host.user, host.key, known_hosts, timeout=CONNECT_TIMEOUT_S)
    except RemoteError as exc:
        raise LaunchError(f"{exc} (hostfile: user=, key=)") from None


def remote_command(argv: list[str], env: dict[str, str], cwd: str, tls: bool = False) -> str:
    """The shell line run on the host: report the PID, enter CWD, read the job secret (and with `tls`
    the TLS credentials) from stdin, exec the rank with its variables. `env` must not hold either."""
    for variable in (SECRET_VARIABLE, TLS_CREDENTIALS):
        if variable in env:
            raise LaunchError(f"{variable} must reach a remote rank on stdin, not its command line")
    variables = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
    credentials = (f"IFS= read -r {TLS_CREDENTIALS} || exit 126; export {TLS_CREDENTIALS}; "
                   if tls else "")
    return (f"printf '{PID_MARK.decode()}%s\\n' $$; cd {shlex.quote(cwd)} || exit 127; "
            f"IFS= read -r {SECRET_VARIABLE} || exit 126; export {SECRET_VARIABLE}; {credentials}"
            f"{SSH_WATCHER} exec env {variables} {shlex.join(argv)} {SSH_RANK_REDIRECTS}")


class SshRank:
    """A rank running on a remote host in one SSH exec channel."""

    def __init__(self, spec: RankSpec, client, command: str, host: HostSpec, stdin_line: str = ""):
        self.spec = spec
        self.client = client
        self.host = host
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise LaunchError(f"the SSH connection to {host.address} is gone")
        self.channel = transport.open_session(timeout=CONNECT_TIMEOUT_S)
        self.channel.exec_command(command)
        # stdin stays open: its EOF tells the rank's watcher that the launcher is gone (orphans.py)
        self.channel.sendall((stdin_line + "\n").encode())
        self.stdout = self.channel.makefile("rb")
        self.stderr = self.channel.makefile_stderr("rb")
        self.pid = self._read_pid()

    def _read_pid(self) -> int | None:
        self.channel.settimeout(CONNECT_TIMEOUT_S)
        try:
            line = self.stdout.readline()
        except socket.timeout:
            raise LaunchError(f"{self.spec.name} on {self.host.address} did not start within "
                              f"{CONNECT_TIMEOUT_S:g} s") from None
        finally:
            self.channel.settimeout(None)
        if not line.startswith(PID_MARK):
            raise LaunchError(f"{self.spec.name} on {self.host.address}: unexpected first line {line!r} "
                              f"(does the remote login shell print something?)")
        return int(line[len(PID_MARK):])

    def poll(self) -> int | None:
        if not self.channel.exit_status_ready():
            return None
        status = self.channel.recv_exit_status()
        return NO_EXIT_STATUS if status == -1 else status

    def signal(self, signum: int) -> None:
        if self.pid is None:
            return
        try:
            _stdin, stdout, _stderr = self.client.exec_command(
                f"kill -{int(signum)} -- -{self.pid} 2>/dev/null", timeout=CONNECT_TIMEOUT_S)
            stdout.channel.recv_exit_status()
        except Exception:  # the connection is gone: nothing left to signal through it
            pass


def address_toward(host: HostSpec) -> str:
    """This machine's address on the route to `host` (what the ranks there should dial)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host.host, host.port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)  # UDP: no packet is sent, the kernel only picks the route
        return probe.getsockname()[0]


def resolve(host: HostSpec) -> str:
    """The host's address."""
    return socket.getaddrinfo(host.host, host.port, type=socket.SOCK_STREAM)[0][4][0]

