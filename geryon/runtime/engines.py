"""A rank another engine started (torchrun, Slurm, Kubernetes' PyTorchJob or JobSet): what geryon.launch
would have done for it, done inside `geryon.init()` (docs/engines.md).

geryon.launch hosts the job's store, starts the parameter servers as programs of their own and gives
the workers ranks that count workers only. Under an engine every process runs the user's script, so
`join_engine_job` does those parts where the script calls `geryon.init()`:
  store    the job's TCPStore at MASTER_ADDR:MASTER_PORT. torchrun's agent serves one
           (TORCHELASTIC_USE_AGENT_STORE=True, also with c10d rendezvous, where MASTER_ADDR/PORT
           name the rendezvous store); otherwise (Slurm, or torchrun told not to share its store) the
           engine's rank 0 hosts it, as torch's tcp:// rendezvous would, whatever its role.
  servers  in a ps job with servers (RankEnv.role "server", geryon.runtime.env.split_roles), the
           process runs geryon.runtime.server's role inside init(): it serves until every worker
           has finished, then the process exits (0; 1 when a worker was lost), so the script's
           training code never runs on a server.
  workers  with servers in the job, the workers' process group has the workers only (rank and world
           size count workers, and RANK / WORLD_SIZE in os.environ are rewritten to say so, for
           scripts and samplers that read them); it meets in the job's store under its own prefix.
Without servers the engine's process group is the workers' one and torch's own rendezvous is used.
"""

import atexit
import os
import sys
from datetime import timedelta

from geryon import envvars
from geryon.runtime.env import RankEnv

ENGINES = ("torchrun", "slurm")
PROCESS_GROUP_PREFIX = "workers/"

NO_SECRET_NOTE = (f"geryon: no job secret ({envvars.JOB_SECRET} or {envvars.JOB_SECRET_FILE}): gloo carries "
                  "this job's gradients, without priority classes; set one on every rank for geryon's flows "
                  "(docs/engines.md)")

_hosted_store = None   # the job's store when this process hosts it: kept for the process's life


def join_engine_job(context: RankEnv, backend: str, timeout: timedelta) -> None:
    """Host the store if this process must, serve and exit if it is a server, else join the workers."""
    if context.launcher not in ENGINES:
        return
    if context.distributed and not context.has_transport and context.is_main:
        print(NO_SECRET_NOTE, file=sys.stderr, flush=True)
    if not context.servers:
        return
    if not context.agent_store and context.engine_rank == 0:
        host_store(context, timeout)
    if context.role == "server":
        serve_and_exit(context)
    _set_worker_numbering(context)
    if context.distributed:
        _join_workers(context, backend, timeout)


def host_store(context: RankEnv, timeout: timedelta) -> None:
    """Serve the job's TCPStore at MASTER_PORT from this process (engine rank 0, no agent store)."""
    global _hosted_store
    from torch.distributed import TCPStore

    from geryon.errors import ConfigError

    if not context.master_addr or not context.master_port:
        raise ConfigError("the job's store needs MASTER_ADDR and MASTER_PORT (under Slurm: MASTER_PORT, or "
                          "SLURM_JOB_ID to derive it, and MASTER_ADDR or SLURM_STEP_NODELIST)")
    if _hosted_store is None:
        _hosted_store = TCPStore(context.master_addr, context.master_port, is_master=True,
                                 wait_for_workers=False, timeout=timeout, multi_tenant=True)


def serve_and_exit(context: RankEnv) -> None:
    """Run the server role until the workers have finished, then end the process with its exit code."""
    from geryon.runtime import server

    code = server.run_role(context)
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


def _set_worker_numbering(context: RankEnv) -> None:
    os.environ["RANK"] = str(context.rank)
    os.environ["WORLD_SIZE"] = str(context.world_size)


def _join_workers(context: RankEnv, backend: str, timeout: timedelta) -> None:
    """torch.distributed's default group over the workers only, met in the job's store."""
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore

    if dist.is_initialized():
        return
    store = TCPStore(context.master_addr, context.master_port, is_master=False, wait_for_workers=False,
                     timeout=timeout)
    dist.init_process_group(backend, store=PrefixStore(context.store_prefix + PROCESS_GROUP_PREFIX, store),
                            rank=context.rank, world_size=context.world_size, timeout=timeout)
    atexit.register(_leave)


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
