"""Scheduling policies: how tensors become flows, slices and send order (one per paper baseline).

    vanilla  one flow per peer, whole tensors, FIFO in the order the framework produces them;
             PS parameters assigned whole to servers round-robin
    slicing  one flow per peer, tensors cut into slices spread over the servers, FIFO
             (the paper's "Partition + Slicing")
    endhost  one flow per peer, slices sent from a sender-side priority queue by
             (class, urgency) -- TicTac/P3-style end-host scheduling
    geryon   one flow per priority class, marked with that class's DSCP; slices by urgency
             within each class; the switch's priority queues do the rest

Single-flow policies mark their flow with the lowest class's DSCP (best effort by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from geryon.errors import ConfigError


@dataclass(frozen=True)
class Policy:
    """What a scheduling policy decides, as plain data."""
    name: str
    flow_per_class: bool      # one TCP connection per priority class (else one per peer)
    sliced: bool              # cut tensors into slices of TransportConfig.slice_bytes
    urgency_order: bool       # send queue ordered by urgency (else FIFO)
    spread_over_servers: bool  # PS: slices spread over servers (else whole tensors round-robin)

    def flow_of(self, priority: int) -> int:
        """The flow (connection index to a peer) that carries a given priority class."""
        return priority if self.flow_per_class else 0

    def flows(self, classes: int) -> int:
        return classes if self.flow_per_class else 1

    def send_key(self, epoch: int, priority: int, urgency: int, seq: int) -> tuple:
        """Sort key of a frame in its flow's send queue (smaller goes first).

        `epoch` (a PS iteration, a group reduce's number) comes first so that a later one never
        overtakes an earlier one on the same connection. The ring allreduce uses `collective_key`.
        """
        if not self.urgency_order:
            return (epoch, seq)
        return (epoch, priority, urgency, seq)

    def collective_key(self, collective: int, priority: int, urgency: int, seq: int) -> tuple:
        """Sort key of a ring allreduce frame in its flow's send queue (smaller goes first).

        Under the ordering policies the class comes first, then the collective: a slice of a later,
        more urgent collective leaves before the queued slices of an earlier, less urgent one
        (preemption by slicing), while collectives of one class keep their order. The FIFO policies
        send collective after collective, in queuing order.
        """
        if not self.urgency_order:
            return (collective, seq)
        return (priority, collective, urgency, seq)


# How a PS plan deals slices to servers (geryon.transport.shards.plan_shards): "bytes" to the server
# with the fewest bytes so far, "count" round-robin (P3's way). The launcher, the rank and the simulator
# check their placement against this list.
PLACEMENTS = ("bytes", "count")

POLICIES = {
    "vanilla": Policy("vanilla", flow_per_class=False, sliced=False, urgency_order=False,
                      spread_over_servers=False),
    "slicing": Policy("slicing", flow_per_class=False, sliced=True, urgency_order=False,
                      spread_over_servers=True),
    "endhost": Policy("endhost", flow_per_class=False, sliced=True, urgency_order=True,
                      spread_over_servers=True),
    "geryon": Policy("geryon", flow_per_class=True, sliced=True, urgency_order=True,
                     spread_over_servers=True),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown scheduling policy {name!r}; choose one of "
                          f"{', '.join(POLICIES)}") from None
