"""The one place that changes an interface's queues: applies a QueuePlan, or removes it.

Netlink via pyroute2 for what it models (htb, pfifo, u32); the `tc` command (`tc -n NETNS`) for the
rest (prio, ets, flower on real hosts). Applying first deletes the device's root qdisc, so applying twice
gives the same state; a failure half-way removes the partial configuration before raising.
"""

import errno
import subprocess

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from geryon.errors import InterfaceNotFound, NetconfError, require_root
from geryon.netconf.capabilities import detect_capabilities
from geryon.netconf.plan import (AckFilterOp, ClassOp, FilterOp, Operation, QdiscOp, QueuePlan,
                                 build_priority_plan, build_shaping_plan, handle_to_int)
from geryon.netconf.state import forget_plan_state, netns_inode, save_plan_state

_PYROUTE2_QDISCS = {"htb", "pfifo"}
_PYROUTE2_CLASSES = {"htb"}
_PYROUTE2_FILTERS = {"u32"}


def install_priority_queues(dev: str, classes=None, rate: "int | str | None" = None,
                            netns: str | None = None, ack_priority: "bool | str" = False) -> QueuePlan:
    """Program strict priority queues on dev's egress and return the applied plan.

    HTB at `rate` with one class per priority and u32 DSCP filters; with rate None, an unshaped prio/ets
    qdisc where the kernel has one (else HTB at a rate that never binds). With `ack_priority` ('top',
    'own' or True), TCP pure ACKs go to the top class or to one above it (see `AckFilterOp`). Raises
    InterfaceNotFound.
    """
    _require_root()
    ipr, index = open_device(dev, netns)  # check before probing capabilities or building anything
    try:
        capabilities = detect_capabilities() if rate is None else None
        plan = build_priority_plan(dev, classes, rate, capabilities, netns, ack_priority=ack_priority)
        _replace(ipr, index, plan)
    finally:
        ipr.close()
    return plan


def install_shaping(dev: str, rate: "int | str", netns: str | None = None) -> QueuePlan:
    """Shape dev's egress at `rate` with a single FIFO class (no priority); return the plan."""
    plan = build_shaping_plan(dev, rate, netns)
    apply_plan(plan)
    return plan


def remove_queues(dev: str, netns: str | None = None) -> None:
    """Delete dev's root qdisc, returning it to the kernel default; no error if there was none."""
    _require_root()
    ipr, index = open_device(dev, netns)
    try:
        _delete_root(ipr, index)
    finally:
        ipr.close()
    forget_plan_state(dev, netns)


def apply_plan(plan: QueuePlan) -> None:
    """Replace dev's egress configuration with `plan` (netns taken from plan.netns)."""
    _require_root()
    ipr, index = open_device(plan.dev, plan.netns)
    try:
        _replace(ipr, index, plan)
    finally:
        ipr.close()


def _replace(ipr: IPRoute, index: int, plan: QueuePlan) -> None:
    _delete_root(ipr, index)
    try:
        for op in plan.ops:
            _apply_op(ipr, index, op, plan.netns)
    except NetconfError:
        _delete_root(ipr, index)
        forget_plan_state(plan.dev, plan.netns)
        raise
    save_plan_state(plan)


def open_device(dev: str, netns: str | None) -> tuple[IPRoute, int]:
    """Open netlink in netns and find dev; raise InterfaceNotFound if either is missing."""
    # IPRoute(netns=...) would silently create a missing namespace, so check first.
    if netns and netns_inode(netns) is None:
        raise InterfaceNotFound(
            f"network namespace {netns!r} does not exist (see `ip netns list`), so {dev!r} cannot be found")
    try:
        ipr = IPRoute(netns=netns) if netns else IPRoute()
    except (OSError, NetlinkError) as exc:
        raise NetconfError(f"cannot open netlink in namespace {netns!r}: {exc}") from exc
    indices = ipr.link_lookup(ifname=dev)
    if not indices:
        ipr.close()
        where = f"namespace {netns!r}" if netns else "the root namespace"
        raise InterfaceNotFound(f"interface {dev!r} does not exist in {where} "
                                f"(list them with `ip {'-n ' + netns + ' ' if netns else ''}link`)")
    return ipr, indices[0]


def _require_root() -> None:
    require_root("programming queues (CAP_NET_ADMIN)", "run with sudo, or use `geryon netconf show` for a dry run")


def _delete_root(ipr: IPRoute, index: int) -> None:
    try:
        ipr.tc("del", index=index, parent=0xFFFFFFFF)
    except NetlinkError as exc:
        if exc.code not in (errno.ENOENT, errno.EINVAL):  # nothing there to delete
            raise NetconfError(f"cannot delete the root qdisc: {exc.args[-1]}") from exc


def _apply_op(ipr: IPRoute, index: int, op: Operation, netns: str | None) -> None:
    try:
        if isinstance(op, QdiscOp) and op.kind in _PYROUTE2_QDISCS and op.action == "add":
            ipr.tc("add", op.kind, index=index, **_qdisc_kwargs(op))
        elif isinstance(op, ClassOp) and op.kind in _PYROUTE2_CLASSES and op.action == "add":
            ipr.tc("add-class", op.kind, index=index, **_class_kwargs(op))
        elif isinstance(op, (FilterOp, AckFilterOp)) and op.kind in _PYROUTE2_FILTERS and op.action == "add":
            ipr.tc("add-filter", "u32", index=index, parent=handle_to_int(op.parent), prio=op.pref,
                   protocol=op.ethertype, target=handle_to_int(op.flowid), keys=op.u32_keys())
        else:
            _run_tc(op, netns)
    except NetlinkError as exc:
        raise NetconfError(f"`tc {' '.join(op.tc_args())}` failed: {exc.args[-1]} "
                           f"(errno {exc.code})") from exc


def _qdisc_kwargs(op: QdiscOp) -> dict:
    kwargs = {"handle": handle_to_int(op.handle)}
    if op.parent != "root":
        kwargs["parent"] = handle_to_int(op.parent)
    for name, value in op.params:
        kwargs[name] = int(value, 16) if name == "default" else value
    return kwargs


def _class_kwargs(op: ClassOp) -> dict:
    kwargs = {"handle": handle_to_int(op.classid), "parent": handle_to_int(op.parent)}
    for name, value in op.params:
        kwargs[name] = f"{value}bit" if name in ("rate", "ceil") else value
    return kwargs


def _run_tc(op: Operation, netns: str | None) -> None:
    argv = ["tc", *(["-n", netns] if netns else []), *op.tc_args()]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetconfError("the `tc` command is missing: install iproute2") from None
    if result.returncode != 0:
        raise NetconfError(f"`{' '.join(argv)}` failed: {result.stderr.strip() or result.returncode}")
