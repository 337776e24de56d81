"""Transport: per-priority TCP flows marked with DSCP, feeding a parameter server and a ring allreduce.

Modules, one job each:
  wire             the 44-byte frame header (8 bytes for a continuation), validated before anything is read
  socketio         exact reads into caller buffers, the frame reader, vectored writes
  handshake        mutual HMAC-SHA256 authentication with the per-job secret, version and job-id checks
  tls              optional TLS under every flow: per-job credentials, mutual checks, a full-duplex socket
  config           TransportConfig: every knob in one dataclass
  trace            TransferEvent and the optional tracer callback (queued/send_start/send_done/recv_done)
  policy           vanilla / slicing / endhost / geryon, as plain data (POLICIES: the one list of them)
  flows            FlowPool and Flow: one connection per (peer, class), send queues, receiver threads
  elementwise      sums, means and copies on the transport's own threads
  buckets          allreduce bucket plans and their digest
  prepared         what a repeated allreduce of the same tensors keeps between calls
  allreduce        AllreduceGroup: ring reduce-scatter + all-gather, deterministic reduction order
  group_reduce     GroupReduce: an average among any subgroup of the workers, over a mesh of flows
  shards           PS shard plans (whole tensors round-robin, or slices spread over servers)
  ps_protocol      the PS protocol (push, pull, STEP, ABSENT) and the shard layout both sides share
  ps_server        ParameterServer: aggregates pushes, runs the optimizer on its shards, answers pulls
  ps_worker        PSWorker: pushes gradient shards, pulls parameters into the model's tensors
  staging          how GPU tensors cross the flows: pinned host slots per flow, side streams, events
  server_optimizer OptimizerSpec: the user's optimizer as data, which every server rebuilds per shard
  signed_store     a rendezvous store whose values are authenticated with the job secret
  hooks            DDP comm hook and TCPStore rendezvous
(Its benchmarks and their role processes are in geryon.bench: transport, transport_roles, priority.)

Usage (every rank passes the same tensors, in the same order; priorities: class 0 most urgent):

    from geryon.transport import TransportConfig, AllreduceGroup, ParameterServer, PSWorker
    config = TransportConfig(secret="per-job secret", policy="geryon", class_dscp=(46, 0))
    peers = [("10.0.0.1", 29500), ("10.0.0.2", 29500)]          # or hooks.peers_from_store(...)
    with AllreduceGroup(rank, len(peers), peers, config) as group:
        group.allreduce(grads, priorities=[0, 0, 1], op="avg")   # in place, bit-exact order

    server = ParameterServer(s, servers, workers, init_params, config, ("0.0.0.0", 29600),
                             priorities, lr=0.1, momentum=0.9, weight_decay=1e-4)
    worker = PSWorker(rank, workers, server_addresses, model_params, config, priorities)
    worker.step(grads)          # push this iteration's gradients, request the next parameters
    worker.wait_param(0)        # before layer 0's forward; the others keep arriving meanwhile

Errors: TransportError (peer closed/reset), PeerTimeout (no progress within config.timeout, or a
peer not up within config.connect_timeout when the job starts; that one defaults to timeout),
PeerAborted (a peer reports the job failing elsewhere: a PS server that lost a worker, a ring
neighbour that lost its other neighbour; the message names the rank that failed),
AuthenticationError (wrong secret), ProtocolError (malformed frame, plan mismatch).

Tracing: `TransportConfig(tracer=callback)` gets a `TransferEvent` per data slice queued, started,
sent and received (see `trace`).
"""

import importlib

# name -> module; loaded on first use, so that `geryon.transport.policy` (the policies' names, which the
# launcher checks its flags against) can be imported without torch
_EXPORTS = {
    "AllreduceGroup": "allreduce", "reference_allreduce": "allreduce",
    "TransportConfig": "config",
    "POLICIES": "policy", "Policy": "policy", "get_policy": "policy",
    "ParameterServer": "ps_server", "PSWorker": "ps_worker",
    "TransferEvent": "trace",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'geryon.transport' has no attribute {name!r}")
    return getattr(importlib.import_module(f"geryon.transport.{_EXPORTS[name]}"), name)
