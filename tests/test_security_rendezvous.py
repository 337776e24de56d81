"""Issue 13, finding 1 at the rendezvous: where the store listens, and who may steer the ranks."""

import socket
from datetime import timedelta

import pytest

from geryon.errors import AuthenticationError
from geryon.runtime import jobtransport
from geryon.runtime.env import RankEnv
from geryon.launch.rendezvous import hosted_store

SECRET = "rendezvous-secret"


def _reachable(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_local_store_listens_on_loopback_address_only():
    with hosted_store("127.0.0.1") as port:
        assert _reachable("127.0.0.1", port)
        assert not _reachable("127.0.0.2", port), "the store answers on an address it was not given"


def _rank_env(port: int, secret: str = SECRET) -> RankEnv:
    return RankEnv.from_environ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                 "GERYON_JOB_SECRET": secret})


def test_values_written_without_the_secret_are_refused():
    from torch.distributed import TCPStore

    with hosted_store("127.0.0.1") as port:
        server_side = jobtransport.open_store(_rank_env(port))
        worker_side = jobtransport.open_store(_rank_env(port))
        server_side.set("geryon/ps/server/0/0", "127.0.0.1:5000")
        assert worker_side.get("geryon/ps/server/0/0") == b"127.0.0.1:5000"

        intruder = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                            timeout=timedelta(seconds=10))
        intruder.set("geryon/ps/server/0/0", "127.0.0.1:6666")            # points workers at itself
        with pytest.raises(AuthenticationError, match="not signed"):
            worker_side.get("geryon/ps/server/0/0")
        intruder.set("geryon/ps/server/1/0", intruder.get("geryon/ps/server/0/0"))   # a replayed value
        server_side.set("geryon/ps/server/0/0", "127.0.0.1:5000")
        intruder.set("geryon/ps/server/1/0", intruder.get("geryon/ps/server/0/0"))
        with pytest.raises(AuthenticationError):
            worker_side.get("geryon/ps/server/1/0")
        other_job = jobtransport.open_store(_rank_env(port, secret="another-job"))
        other_job.set("geryon/ps/spec", b"weights")
        with pytest.raises(AuthenticationError):
            worker_side.get("geryon/ps/spec")
