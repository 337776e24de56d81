"""The sniffing process: counts packets and bytes per (source IP, DSCP) on one interface.

`DscpSniffer` (geryon.netconf.verify) runs this module inside a namespace with `ip netns exec`, because a
namespace is entered per process. Protocol on stdout: one line `READY` once the capture socket is open,
then, after SIGTERM/SIGINT or when the count or duration is reached, one JSON line with the tallies.
Errors go to stderr with exit status 1. Only scapy's IP layers are imported, to start fast.
"""

import argparse
import json
import signal
import socket
import sys
import threading
import time

from geryon.signals import event_set_by_signals

DRAIN_IDLE_S = 0.25  # on stop, keep reading until the capture has been idle this long...
DRAIN_MAX_S = 3.0  # ...but no longer than this
RECEIVE_BUFFER = 64 * 2**20  # bytes of captured frames the kernel may hold for us
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # as root, beyond net.core.rmem_max


class MarkTally:
    """Packets and bytes per (source, DSCP) of the frames fed to it."""

    def __init__(self):
        self.marks: dict[tuple[str, int], list[int]] = {}
        self.other_packets = 0
        self.last_packet = time.monotonic()

    def add(self, pkt) -> None:
        from scapy.layers.inet import IP
        from scapy.layers.inet6 import IPv6
        self.last_packet = time.monotonic()
        if IP in pkt:
            layer = pkt[IP]
            source, dscp, ip_length = layer.src, layer.tos >> 2, layer.len
        elif IPv6 in pkt:
            layer = pkt[IPv6]
            source, dscp, ip_length = layer.src, layer.tc >> 2, 40 + layer.plen
        else:
            self.other_packets += 1
            return
        # Sizes come from the IP header, not the capture, which may hold a truncated GSO super-packet.
        entry = self.marks.setdefault((source, dscp), [0, 0])
        entry[0] += 1
        entry[1] += len(pkt) - len(layer) + (ip_length or len(layer))

    def as_list(self) -> list[dict]:
        return [{"source": source, "dscp": dscp, "packets": packets, "bytes": size}
                for (source, dscp), (packets, size) in sorted(self.marks.items())]


def sniff_marks(iface: str, bpf_filter: str | None, count: int | None, duration: float | None,
                on_ready, stop_event: threading.Event) -> dict:
    """Capture until count, duration or stop_event; return the JSON-ready result."""
    import scapy.layers.inet  # noqa: F401  (the layers must be bound before the socket opens)
    import scapy.layers.inet6  # noqa: F401
    from scapy.config import conf
    from scapy.sendrecv import AsyncSniffer
    tally = MarkTally()
    capture = conf.L2listen(iface=iface, filter=bpf_filter)
    try:
        # GSO super-packets are ~64 KB each: the default buffer holds only a few, and Python reads slowly.
        capture.ins.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
        sniffer = AsyncSniffer(opened_socket=capture, prn=tally.add, store=False, count=count or 0,
                               started_callback=on_ready)
        started = time.monotonic()
        _run_until_done(sniffer, tally, started + duration if duration is not None else float("inf"),
                        stop_event)
    finally:
        capture.close()
    return {"iface": iface, "filter": bpf_filter, "duration_s": round(time.monotonic() - started, 3),
            "other_packets": tally.other_packets, "marks": tally.as_list()}


def _run_until_done(sniffer, tally: MarkTally, deadline: float, stop_event: threading.Event) -> None:
    sniffer.start()
    while sniffer.thread.is_alive() and time.monotonic() < deadline and not stop_event.wait(0.05):
        pass
    if stop_event.is_set():  # asked to stop: first count what is already captured but not yet read
        drain_end = time.monotonic() + DRAIN_MAX_S
        while (sniffer.thread.is_alive() and time.monotonic() < drain_end
               and time.monotonic() - tally.last_packet < DRAIN_IDLE_S):
            time.sleep(0.02)
    if sniffer.running:
        sniffer.stop()
    else:
        sniffer.join()  # re-raises a capture error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iface", required=True)
    parser.add_argument("--filter", default=None)
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None)
    args = parser.parse_args(argv)
    stop_event = event_set_by_signals(signal.SIGTERM, signal.SIGINT)

    def on_ready():
        print("READY", flush=True)

    try:
        result = sniff_marks(args.iface, args.filter, args.count, args.duration, on_ready, stop_event)
    except Exception as exc:  # reported to the parent, which raises a typed error
        print(f"sniffing {args.iface} failed: {exc}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
