"""The parameter-server role: what `python -m geryon.runtime.server` runs for each of a ps job's servers.

The launcher starts M of these next to the workers (RankEnv role `server`, server_rank j) and
stops them with SIGTERM once every worker has finished; a server that exits on its own while workers
still run fails the job. Under torchrun or Slurm the server ranks run the same role inside
`geryon.init()` (geryon.runtime.engines) and return as soon as every worker has finished: there is no
launcher to wait for, and the engine counts the job done when every process has exited.

A server runs geryon.transport's `ParameterServer`:
  1. it waits (until SIGTERM) for worker 0 to publish the job's starting point in the store under
     `<store prefix>ps/spec` (initial parameter values, each tensor's class and urgency, the
     user's optimizer as an OptimizerSpec -- class name and groups as JSON, or "mean" when the workers
     step -- and any optimizer state loaded before training; see geryon.runtime.ps_sync), which
     worker 0 does on the model's first forward call;
  2. it listens on the rank's host address (a free port) and publishes `host:port` under
     `ps/server/<j>`; workers authenticate with the job secret;
  3. it serves pushes and pulls, per priority class, running the user's torch.optim class on its
     shards (geryon.transport.server_optimizer) on the CPU, or on its GPU with --server-device cuda
     (geryon.transport.ps_server), until every worker is gone (said goodbye, or
     lost: then it names the worker; gone means its control flow ended, not any one connection
     under its id: the rule is in geryon.transport.ps_server's docstring), and holds the role until
     the launcher's SIGTERM (exit 0, or 1 when a worker was lost). The transport's closed connection or timeout
     (RankEnv.transport_timeout) marks a lost worker, so a dead worker never hangs a server.
  4. --priority search: when every worker has left and worker 0 announced class switch n under
     `ps/switch/<n>` (see geryon.runtime.ps_sync), the workers are not gone but switching: the
     server takes its shards' values, optimizer state and version, builds a new ParameterServer with
     the new classes from them (shards can move between servers when the plan changes: with
     several servers each publishes its state under `ps/switch/<n>/state/<j>` and reads the
     others'), publishes its new address under `ps/switch/<n>/server/<j>` and serves again.
  Clipping by the global norm with several servers: each server publishes its part of the norm of
  the averaged gradient under `ps/norm/<iteration>/<j>` and reads the others' (`NormExchange`).
  A worker's STATE request (optimizer.state_dict() / load_state_dict()) goes through the store too
  (geryon.runtime.ps_checkpoint.state_exchange).
  --ps-checkpoint-every K: worker 0 asks every K steps for a checkpoint, which the server writes to
  its --ps-checkpoint-dir; a server that starts with a consistent step S there takes its shards'
  values, optimizer state and version S from it instead of the spec (geryon.runtime.server_checkpoint).
"""

import functools
import io
import logging
import signal
import struct
import sys
import threading

from geryon.errors import GeryonError
from geryon.quickexit import exit_without_collecting
from geryon.runtime import env as rank_env
from geryon.runtime import jobtransport
from geryon.runtime.env import RankEnv
from geryon.runtime import server_checkpoint
from geryon.runtime.ps_sync import SPEC_KEY, SWITCH_KEY, decode_priorities, decode_spec, server_key
from geryon.runtime.store_blobs import get_blob, put_blob
from geryon.signals import event_set_by_signals

SWITCH_STATE_KEY = "ps/switch/{switch}/state/{index}"
NORM_KEY = "ps/norm/{iteration}/{index}"

POLL_S = 0.2
EXIT_WORKER_LOST = 1


def serve(env: RankEnv) -> int:
    """Run this process's server role until the workers leave or the launcher stops it."""
    from geryon.runtime.device import server_device

    device = server_device(env.server_device, env.local_rank)   # before training starts: a wrong one stops the job
    stopped = event_set_by_signals(signal.SIGTERM, signal.SIGINT)
    index, count, workers = env.server_rank, env.servers or 1, env.workers
    name = f"server {index} of {count}"
    prefix = env.store_prefix
    store = jobtransport.open_store(env)
    spec = _wait_for_spec(store, prefix + SPEC_KEY, stopped)
    if spec is None:
        return 0
    import torch

    from geryon.timeline import rank_timeline
    from geryon.transport import ParameterServer

    # a server only updates slices on its transport threads: torch's intra-op threads would split each
    # slice's optimizer step and then spin, burning the CPU the colocated workers need (see
    # docs/transport.md)
    torch.set_num_threads(1)

    timeline = rank_timeline(env.timeline, env.name)
    config = jobtransport.transport_config(env, tracer=timeline.transfer if timeline else None)
    host = jobtransport.listen_host(env)
    values, priorities, switch = spec["values"], spec["priorities"], 0
    optimizer = spec["optimizer"]
    restore = (spec.get("states"), 0) if spec.get("states") else None
    if env.resumed_step:
        values, states = server_checkpoint.load(env.ps_checkpoint_dir, env.resumed_step, values)
        restore = (states, env.resumed_step)
        print(f"{name}: resuming from the checkpoint of step {env.resumed_step} in {env.ps_checkpoint_dir}",
              flush=True)
    while True:
        with ParameterServer(index, count, workers, values, config, (host, 0), priorities,
                             optimizer=optimizer, step_frames=True, device=device,
                             norm_exchange=NormExchange(store, prefix, index, count),
                             state_exchange=functools.partial(server_checkpoint.exchange, store,
                                                                  env.ps_checkpoint_dir)) as server:
            if restore is not None:
                restore_state(server, *restore)
            store.set(prefix + server_key(index, switch), f"{host}:{server.port}")
            if switch == 0:
                sizes = sum(v.numel() * v.element_size() for v in values)
                update = ("averaging gradients (the workers step)" if optimizer.mean_only
                          else f"running {optimizer.name}") + (f" on {device}" if device.type != "cpu" else "")
                print(f"{name}: serving {len(server.values())} shards of {sizes / 1e6:.1f} MB of parameters "
                      f"to {workers} workers on {host}:{server.port} (policy {config.policy}"
                      f"{', TLS' if config.tls else ''}), {update}",
                      flush=True)
            while not stopped.is_set():
                server.serve_until_workers_leave(timeout=POLL_S)
                if len(server.workers_gone()) >= workers:
                    break
            lost = {} if stopped.is_set() else {w: f for w, f in server.pool.lost().items()
                                                if w in server.joined}
            next_switch = prefix + SWITCH_KEY.format(switch=switch + 1)
            if stopped.is_set() or lost or not store.check([next_switch]):
                break
            switch += 1
            priorities = decode_priorities(store.get(next_switch))
            values, restore = switched_state(server, store, prefix, switch, count, values)
        print(f"{name}: switched to the classes of search switch {switch} at version {restore[1]}",
              flush=True)
    for worker, failure in sorted(lost.items()):
        print(f"{name}: lost worker {worker}: {failure}", file=sys.stderr, flush=True)
    if not stopped.is_set() and not lost:
        print(f"{name}: every worker finished", flush=True)
    if env.launcher == "geryon":
        stopped.wait()  # the launcher stops servers after the workers; exiting first would look like a failure
    return EXIT_WORKER_LOST if lost else 0


def switched_state(server, store, prefix: str, switch: int, count: int, values):
    """(values, (states, version)) of the whole model after switch `switch`, from every server.

    Only the shards a server holds are its own; with several servers each publishes them and
    assembles the others', so a shard that moves to another server keeps its value and state.
    """
    import torch

    from geryon.transport.server_optimizer import full_state

    mine = {key: (state.value(), state.state(), state.version)
            for key, state in server.shards.items()}
    put_blob(store, prefix + SWITCH_STATE_KEY.format(switch=switch, index=server.index), _save(mine))
    merged = {}
    for other in range(count):
        merged.update(mine if other == server.index else
                      torch.load(io.BytesIO(get_blob(store, prefix + SWITCH_STATE_KEY.format(
                          switch=switch, index=other))), weights_only=True))
    new_values = [v.detach().clone() for v in values]
    parts: dict[int, list] = {}
    versions = set()
    for (tensor, offset), (param, state, version) in merged.items():
        new_values[tensor].view(-1)[offset:offset + param.numel()] = param
        versions.add(version)
        parts.setdefault(tensor, []).append((offset, state))
    if len(versions) != 1:
        raise GeryonError(f"server {server.index}: shards at versions {sorted(versions)} when switching "
                          "classes; the workers must drain before a switch")
    states = [full_state(parts.get(tensor, []), value) or None for tensor, value in enumerate(new_values)]
    return new_values, (states, versions.pop())


def restore_state(server, states, version: int) -> None:
    """Give a (re)built server's shards the optimizer state and version of the whole model."""
    server.load_shards(None, states)
    server.set_version(version)


class NormExchange:
    """Servers share their part of the gradient norm through the store (clipping, several servers)."""

    def __init__(self, store, prefix: str, index: int, count: int):
        self.store, self.prefix, self.index, self.count = store, prefix, index, count

    def __call__(self, iteration: int, partial: float) -> list[float]:
        key = self.prefix + NORM_KEY
        self.store.set(key.format(iteration=iteration, index=self.index), struct.pack("!d", partial))
        return [struct.unpack("!d", self.store.get(key.format(iteration=iteration, index=j)))[0]
                for j in range(self.count)]


def _save(data) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


def _wait_for_spec(store, key: str, stopped: threading.Event):
    """The decoded spec once worker 0 published it; None if stopped first."""
    while not stopped.is_set():
        if store.check([key]):
            return decode_spec(get_blob(store, key))
        stopped.wait(POLL_S)
    return None


def main() -> int:
    try:
        env = rank_env.current()
    except GeryonError as exc:
        print(f"server: error: {exc}", file=sys.stderr, flush=True)
        return 1
    if env.role != "server":
        print("geryon.runtime.server is started by `python -m geryon.launch --mode ps`, not by hand",
              file=sys.stderr)
        return 2
    return run_role(env)


def run_role(env: RankEnv) -> int:
    """serve(env), its errors printed as one line: the process's exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    exit_without_collecting()   # a server imports torch: its exit need not collect torch's objects
    try:
        return serve(env)
    except GeryonError as exc:
        print(f"server {env.server_rank}: error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
