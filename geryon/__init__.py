"""Geryon: network-level flow scheduling for distributed deep-learning training.

Sub-packages, one job each (imports flow one way: the launcher composes the others):
  categorize/  ranks parameters by urgency and splits them into priority classes
  transport/   per-priority TCP flows marked with DSCP, parameter-server and allreduce modes
  netconf/     priority queues on interfaces (Linux tc) and switch QoS profiles
  emulate/     an emulated cluster in network namespaces behind a priority-queued switch
  launch/      the launcher (`python -m geryon.launch`); runtime/ what runs inside each rank
  bench/       benchmarks composing the parts
"""

__version__ = "0.1.0"

_API = ("init", "distribute", "average", "context", "clip_grad_norm_", "wait_parameters")


def __getattr__(name):
    """`geryon.init()` / `geryon.distribute()` come from geryon.runtime.api, imported on first use (torch is slow)."""
    if name in _API:
        from geryon.runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'geryon' has no attribute {name!r}")
