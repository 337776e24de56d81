"""The job's rendezvous: a `torch.distributed.TCPStore` hosted by the launcher itself.

Ranks reach it at MASTER_ADDR:MASTER_PORT as clients (TORCHELASTIC_USE_AGENT_STORE=True), exactly as
under torchrun. The store listens only on the address the ranks dial (loopback for a --local job):
torch's libuv server would listen on every address whatever host it is given, so the launcher binds
the listening socket itself and hands it over (`master_listen_fd`). Whoever can reach the store can
still write it; what ranks read from it is signed with the job secret (geryon.transport.signed_store).

On the emulated cluster the launcher lives in the root namespace, which has no route into the hosts;
so the store's listening socket is created by a short-lived thread that first joins a host's network
namespace (setns changes only the calling thread). The socket stays in that namespace, and the
store's own threads serve it from there, for as long as the job runs.
"""

import ctypes
import os
import socket
import threading
from contextlib import contextmanager
from datetime import timedelta

from geryon.errors import LaunchError
from geryon.netnames import netns_path

CLONE_NEWNET = 0x40000000
STORE_TIMEOUT = timedelta(minutes=5)
LISTEN_BACKLOG = 1024


@contextmanager
def hosted_store(address: str, netns: str | None = None):
    """Host a TCPStore for the job's lifetime; yields its port. `address` is what ranks dial."""
    store = _create_in_netns(address, netns) if netns else _create(address)
    try:
        yield store.port
    finally:
        del store  # the only reference: the destructor stops the store's server and closes its socket


def _create(address: str):
    from torch.distributed import TCPStore  # lazy: torch takes seconds to import

    try:
        listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise LaunchError(f"cannot host the rendezvous store on {address}: {exc}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, 0))
        listener.listen(LISTEN_BACKLOG)
        store = TCPStore(address, listener.getsockname()[1], is_master=True, wait_for_workers=False,
                         timeout=STORE_TIMEOUT, master_listen_fd=listener.fileno())
    except (OSError, RuntimeError) as exc:
        listener.close()
        raise LaunchError(f"cannot host the rendezvous store on {address}: {exc}") from None
    listener.detach()   # the store owns the descriptor now and closes it when it stops
    return store


def _create_in_netns(address: str, netns: str):
    import torch.distributed  # noqa: F401  (import in this thread: the namespace switch is not the place)

    result: dict = {}

    def create():
        try:
            enter_netns_this_thread(netns)
            result["store"] = _create(address)
        except BaseException as exc:  # handed to the caller below
            result["error"] = exc

    thread = threading.Thread(target=create, name=f"store-in-{netns}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["store"]


def enter_netns_this_thread(netns: str) -> None:
    """Move the calling thread (only) into network namespace `netns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns_path(netns), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise LaunchError(f"cannot enter namespace {netns}: {os.strerror(errno)}")
    finally:
        os.close(fd)
