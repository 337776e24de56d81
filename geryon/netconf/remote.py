"""SSH to managed hosts and switches: where a target lives, and one authenticated shell to it.

`Endpoint.parse("linux@admin@10.0.0.1:2222")` names a target kind and an SSH address; `SshShell` runs
commands there with paramiko, the host key checked against a known_hosts file: a host that is missing or
presents another key is refused (HostKeyError) before a single command runs. Nothing here knows what the
commands mean; `linuxapply` and `session` do.

An endpoint with a `netns` is dialed from inside that network namespace (an emulated cluster's: its
addresses exist only there), whatever namespace this process runs in: a helper thread enters the
namespace, makes the TCP connection and hands the socket to paramiko. The socket stays in the namespace
it was made in, so nothing to such an endpoint ever leaves through this machine's own interfaces.
"""

import ctypes
import logging
import os
import re
import shlex
import socket
import threading
from dataclasses import dataclass

from geryon.childproc import NETNS_DIR
from geryon.errors import ConfigError, HostKeyError, PermissionNeeded, RemoteError
from geryon.netnames import check_netns_name

logging.getLogger("paramiko").setLevel(logging.WARNING)  # its INFO lines would drown the report

CONNECT_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 120.0
_ENDPOINT = re.compile(r"^(?P<kind>[a-z]+)@(?:(?P<user>[A-Za-z0-9_.-]+)@)?(?P<host>\[[0-9A-Fa-f:]+\]|[A-Za-z0-9_.-]+)"
                       r"(?::(?P<port>\d+))?$")


@dataclass(frozen=True)
class Endpoint:
    """KIND@[USER@]HOST[:PORT]: a target kind (linux, sonic, ...) and where to reach it over SSH."""

    kind: str
    host: str
    port: int = 22
    user: str | None = None
    key: str | None = None  # private key file; None: the agent and ~/.ssh defaults
    netns: str | None = None  # network namespace the connection leaves from; None: this process's own

    @classmethod
    def parse(cls, text: str, key: str | None = None) -> "Endpoint":
        match = _ENDPOINT.match(text or "")
        if not match:
            raise ConfigError(f"bad target {text!r}: write KIND@HOST, KIND@USER@HOST or KIND@HOST:PORT, "
                              "e.g. linux@10.0.0.5 or sonic@admin@leaf1")
        host = match["host"].strip("[]")
        return cls(match["kind"], host, int(match["port"] or 22), match["user"], key)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


class RefuseUnknownHostKey:
    """paramiko host-key policy: a host missing from known_hosts is an error, with what to do about it."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        raise HostKeyError(
            f"host {hostname} is not in {self.known_hosts} (its {key.get_name()} key has fingerprint "
            f"{key.fingerprint}); geryon never accepts unknown host keys: check the fingerprint, then add "
            f"it, e.g. `ssh-keyscan -p PORT HOST >> {self.known_hosts}`")


_CLONE_NEWNET = 0x40000000  # setns(2): join a network namespace


def connect_in_netns(host: str, port: int, netns: str, timeout: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A TCP connection to host:port made from inside network namespace `netns`.

    A helper thread joins the namespace (setns acts on the calling thread only) and connects; the socket
    keeps its namespace after the thread ends. PermissionNeeded without root, RemoteError when the
    namespace is missing or the connection fails."""
    path = os.path.join(NETNS_DIR, check_netns_name(netns))
    result: dict = {}

    def enter_and_connect():
        try:
            fd = os.open(path, os.O_RDONLY)  # never O_CREAT: a missing namespace is an error, not made
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, os.strerror(errno))
            finally:
                os.close(fd)
            result["sock"] = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=enter_and_connect, name=f"dial-in-{netns}", daemon=True)
    thread.start()
    thread.join()
    error = result.get("error")
    if isinstance(error, FileNotFoundError) and "sock" not in result:
        raise RemoteError(f"cannot connect to {host}:{port}: network namespace {netns} does not exist "
                          "(is the emulated cluster up? see `geryon emulate list`)")
    if isinstance(error, PermissionError):
        raise PermissionNeeded(f"connecting to {host}:{port} from network namespace {netns} needs root "
                               "(entering a namespace); run it with sudo")
    if error is not None:
        raise RemoteError(f"cannot connect to {host}:{port} from network namespace {netns}: {error}")
    return result["sock"]


def open_client(host: str, port: int, user: str | None, key: str | None, known_hosts: str,
                timeout: float = CONNECT_TIMEOUT_S, netns: str | None = None):
    """An authenticated paramiko SSHClient, its host key verified against `known_hosts`; with `netns`,
    the connection is made from inside that network namespace (`connect_in_netns`).

    Raises HostKeyError for an unknown or changed host key, RemoteError when the login or the
    connection fails; the client is closed on every error."""
    import paramiko  # lazy: only remote targets need it

    address = f"{host}:{port}"
    known_hosts_name = host if port == 22 else f"[{host}]:{port}"
    sock = connect_in_netns(host, port, netns, timeout) if netns else None
    client = paramiko.SSHClient()
    client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(RefuseUnknownHostKey(known_hosts))
    try:
        client.connect(host, port=port, username=user, key_filename=key, sock=sock,
                       look_for_keys=key is None, allow_agent=key is None,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyError(
            f"host {address} presented a {exc.key.get_name()} key (fingerprint {exc.key.fingerprint}) "
            f"that does not match {known_hosts}: refusing to connect (possible man-in-the-middle). If "
            f"the host was reinstalled, remove its old entry with `ssh-keygen -R '{known_hosts_name}' "
            f"-f {known_hosts}` and add the new key") from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise RemoteError(f"cannot log in to {address} as {user or 'the current user'}: {exc}; "
                          f"check the user and key") from None
    except HostKeyError:
        client.close()
        raise
    except (OSError, paramiko.SSHException) as exc:
        client.close()
        raise RemoteError(f"cannot connect to {address}: {exc}") from None
    return client


def default_known_hosts() -> str:
    return os.path.expanduser("~/.ssh/known_hosts")


class SshShell:
    """One SSH connection; `run` executes a command line and returns (exit code, stdout, stderr)."""

    def __init__(self, endpoint: Endpoint, known_hosts: str | None = None):
        self.endpoint = endpoint
        self.known_hosts = known_hosts or default_known_hosts()
        if not os.path.exists(self.known_hosts):
            raise HostKeyError(f"known_hosts file {self.known_hosts} does not exist: collect the host keys "
                               f"first, e.g. `ssh-keyscan -p {endpoint.port} {endpoint.host} > FILE`")
        self._client = open_client(endpoint.host, endpoint.port, endpoint.user, endpoint.key, self.known_hosts,
                                   netns=endpoint.netns)

    def run(self, command: str, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT_S) -> tuple[int, str, str]:
        """Run `command` (a shell line) remotely, feeding `stdin`; return (rc, stdout, stderr)."""
        try:
            chan_in, chan_out, chan_err = self._client.exec_command(command, timeout=timeout)
            if stdin is not None:
                chan_in.write(stdin)
            chan_in.channel.shutdown_write()
            out = chan_out.read().decode(errors="replace")
            err = chan_err.read().decode(errors="replace")
            return chan_out.channel.recv_exit_status(), out, err
        except (OSError, EOFError) as exc:
            raise RemoteError(f"{self.endpoint.address}: `{command}` failed: {exc}") from None
        except Exception as exc:  # paramiko.SSHException and socket timeouts
            raise RemoteError(f"{self.endpoint.address}: `{command}` failed: {exc}") from None

    def check(self, command: str, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT_S) -> str:
        """Run `command`; RemoteError with its stderr unless it exits 0; return stdout."""
        rc, out, err = self.run(command, stdin, timeout)
        if rc != 0:
            raise RemoteError(f"{self.endpoint.address}: `{command}` exited {rc}: {err.strip() or out.strip()}")
        return out

    def start(self, command: str, timeout: float = COMMAND_TIMEOUT_S):
        """Start `command` without waiting: (stdin, stdout, stderr) paramiko files to talk to it."""
        try:
            return self._client.exec_command(command, timeout=timeout)
        except Exception as exc:  # paramiko.SSHException and socket errors
            raise RemoteError(f"{self.endpoint.address}: cannot start `{command}`: {exc}") from None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "SshShell":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def quote(words) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)
