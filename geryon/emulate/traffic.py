"""Test traffic over real TCP sockets: a sink, long bulk flows and timed bursts, results as JSON.

Run as `python -m geryon.emulate.traffic MODE ...`, usually inside a host namespace of an emulated
cluster (`cluster.popen(host, traffic_argv(...))`). Three modes:

  sink   --port P                      accept any number of connections; count bytes per connection;
                                       answer burst requests. Prints one JSON line when listening
                                       ({"event": "listening", "port": P}) and one with the counts when
                                       it stops (SIGTERM/SIGINT or --duration).
  bulk   HOST --port P --duration D    send as fast as possible for D seconds, then reset the
                                       connection (so no send-buffer tail keeps loading the network).
                                       Throughput is what the *receiver* acknowledged (TCP_INFO
                                       tcpi_bytes_acked) between --warmup and D, not what was written.
  burst  HOST --port P --bytes N       on a connection set up beforehand, send N bytes and time from
                                       the first byte to the sink's one-byte acknowledgement of the
                                       last; --repeat K bursts spaced by --gap seconds.

Senders mark their packets with `--dscp` (IP_TOS = DSCP << 2), may set `--priority` (SO_PRIORITY,
after IP_TOS, which would otherwise derive it) and choose `--congestion` (TCP_CONGESTION, e.g. bbr or
cubic; any socket may do so as root). `--start-at EPOCH` lets several senders in different namespaces
start together (namespaces share the clock), so process start-up never skews a comparison.

Wire protocol, sender to sink: one mode byte, b"B" (bulk: just count) or b"R" (requests); a request
is an 8-byte big-endian length followed by that many bytes, and the sink answers b"A" once it has
read them all. This module needs only the standard library, so it starts fast in a namespace.
"""

import argparse
import json
import signal
import socket
import struct
import sys
import threading
import time

from geryon.signals import event_set_by_signals

MODE_BULK = b"B"
MODE_REQUESTS = b"R"
ACK = b"A"
CHUNK = 256 * 1024
_TCP_INFO_BYTES_ACKED = 120  # offset of tcpi_bytes_acked (u64) in Linux struct tcp_info (since 4.1)
_TCP_INFO_LEN = 232


def traffic_argv(mode: str, *args: str) -> list[str]:
    """The argv that runs this tool with the current interpreter (the venv's python)."""
    return [sys.executable, "-m", "geryon.emulate.traffic", mode, *args]


def _sender_socket(dscp: int, priority: int | None, congestion: str | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    if priority is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)
    if congestion:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
        except OSError as exc:
            sock.close()
            raise SystemExit(f"traffic: congestion control {congestion!r} not available: {exc}")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _connect(args: argparse.Namespace) -> socket.socket:
    """Connect, retrying while the sink is still starting (up to --connect-timeout seconds)."""
    deadline = time.monotonic() + args.connect_timeout
    while True:
        sock = _sender_socket(args.dscp, args.priority, args.congestion)
        try:
            sock.connect((args.host, args.port))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def socket_marks(sock: socket.socket) -> dict:
    """What a sender socket carries: DSCP, skb priority and congestion control (read back)."""
    congestion = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return {
        "dscp": sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) >> 2,
        "priority": sock.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY),
        "congestion": congestion.split(b"\0", 1)[0].decode(),
    }


def bytes_acked(sock: socket.socket) -> int:
    """Bytes the peer has acknowledged on this TCP connection."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    return struct.unpack_from("=Q", info, _TCP_INFO_BYTES_ACKED)[0]


def _wait_until(epoch: float | None) -> None:
    if epoch is not None:
        delay = epoch - time.time()
        if delay > 0:
            time.sleep(delay)


def _reset_close(sock: socket.socket) -> None:
    """Close with RST: drops the unsent tail instead of letting it drain into the network."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def run_bulk(args: argparse.Namespace) -> dict:
    """Send for --duration seconds; report the receiver-acknowledged throughput after --warmup."""
    sock = _connect(args)
    marks = socket_marks(sock)
    sock.sendall(MODE_BULK)
    sock.settimeout(0.05)  # a starved flow must still notice its deadline
    payload = memoryview(bytes(CHUNK))
    stop = event_set_by_signals(signal.SIGTERM)
    _wait_until(args.start_at)
    start = time.monotonic()
    warm_at, end_at = start + args.warmup, start + args.duration
    written, first = 0, None
    while not stop.is_set():
        now = time.monotonic()
        if first is None and now >= warm_at:
            first = (now, bytes_acked(sock))
        if now >= end_at:
            break
        try:
            written += sock.send(payload)
        except TimeoutError:
            continue
    last = (time.monotonic(), bytes_acked(sock))
    _reset_close(sock)
    if first is None:  # stopped before the warm-up ended: measure from the start
        first = (start, 0)
    seconds = max(last[0] - first[0], 1e-9)
    measured = last[1] - first[1]
    return {
        "mode": "bulk", **marks, "seconds": round(seconds, 4), "bytes": measured,
        "bytes_written": written, "bytes_acked": last[1],
        "throughput_bps": measured * 8 / seconds,
    }


def run_burst(args: argparse.Namespace) -> dict:
    """Time --repeat bursts of --bytes each, from first byte sent to the sink's acknowledgement."""
    sock = _connect(args)
    marks = socket_marks(sock)
    sock.sendall(MODE_REQUESTS)
    payload = bytes(args.bytes)
    _wait_until(args.start_at)
    times = []
    for index in range(args.repeat):
        if index:
            time.sleep(args.gap)
        began = time.perf_counter()
        sock.sendall(struct.pack("!Q", len(payload)) + payload)
        if sock.recv(1) != ACK:
            raise SystemExit("traffic: the sink closed the connection before acknowledging a burst")
        times.append(time.perf_counter() - began)
    sock.close()
    times = [round(t, 6) for t in times]
    ordered = sorted(times)
    return {
        "mode": "burst", **marks, "bytes": args.bytes, "times_s": times,
        "min_s": ordered[0], "median_s": ordered[len(ordered) // 2],
    }


class _Stop(Exception):
    """Raised in the sink's main thread by SIGTERM/SIGINT."""


def _recv_exact(conn: socket.socket, count: int, buffer: memoryview, counter: list) -> bool:
    while count:
        got = conn.recv_into(buffer[:min(count, len(buffer))])
        if not got:
            return False
        counter[0] += got
        count -= got
    return True


def _serve(conn: socket.socket, record: dict) -> None:
    buffer = memoryview(bytearray(CHUNK))
    counter = [0]
    record["counter"] = counter
    try:
        mode = conn.recv(1)
        record["mode"] = {MODE_BULK: "bulk", MODE_REQUESTS: "burst"}.get(mode, "unknown")
        if mode == MODE_BULK:
            while got := conn.recv_into(buffer):
                counter[0] += got
        elif mode == MODE_REQUESTS:
            header = bytearray(8)
            while True:
                view, need = memoryview(header), 8
                while need:
                    got = conn.recv_into(view[8 - need:])
                    if not got:
                        return
                    need -= got
                if not _recv_exact(conn, struct.unpack("!Q", header)[0], buffer, counter):
                    return
                record["bursts"] = record.get("bursts", 0) + 1
                conn.sendall(ACK)
    except OSError:
        pass  # a sender that resets its connection ends it; that is how bulk flows stop
    finally:
        conn.close()


def run_sink(args: argparse.Namespace) -> dict:
    """Accept and serve connections until SIGTERM/SIGINT or --duration; report bytes per connection."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(64)
    print(json.dumps({"event": "listening", "port": listener.getsockname()[1]}), flush=True)

    def stop(*_):
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.duration:
        signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, args.duration)
    records = []
    try:
        while True:
            conn, peer = listener.accept()
            record = {"peer": f"{peer[0]}:{peer[1]}", "mode": None, "counter": [0]}
            records.append(record)
            threading.Thread(target=_serve, args=(conn, record), daemon=True).start()
    except _Stop:
        pass
    finally:
        listener.close()
    connections = [{"peer": r["peer"], "mode": r["mode"], "bytes": r["counter"][0],
                    **({"bursts": r["bursts"]} if "bursts" in r else {})} for r in records]
    return {"mode": "sink", "connections": connections,
            "bytes_total": sum(c["bytes"] for c in connections)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m geryon.emulate.traffic",
                                     description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    sink = modes.add_parser("sink", help="receive, count bytes, acknowledge bursts")
    sink.add_argument("--port", type=int, default=5201, help="0 picks a free port (printed)")
    sink.add_argument("--bind", default="0.0.0.0")
    sink.add_argument("--duration", type=float, default=0.0, help="stop after S seconds (0: on signal)")
    sink.set_defaults(run=run_sink)
    for name, run, help_text in (("bulk", run_bulk, "one long flow, as fast as TCP goes"),
                                 ("burst", run_burst, "timed bursts on one connection")):
        sender = modes.add_parser(name, help=help_text)
        sender.add_argument("host")
        sender.add_argument("--port", type=int, default=5201)
        sender.add_argument("--dscp", type=int, default=0, choices=range(64), metavar="0..63")
        sender.add_argument("--priority", type=int, default=None, help="SO_PRIORITY (skb priority)")
        sender.add_argument("--congestion", default=None, help="TCP congestion control, e.g. bbr, cubic")
        sender.add_argument("--start-at", type=float, default=None, help="wall-clock epoch to start at")
        sender.add_argument("--connect-timeout", type=float, default=5.0)
        sender.set_defaults(run=run)
    bulk = modes.choices["bulk"]
    bulk.add_argument("--duration", type=float, default=5.0, help="seconds to send (SIGTERM ends early)")
    bulk.add_argument("--warmup", type=float, default=1.0, help="seconds not counted at the start")
    burst = modes.choices["burst"]
    burst.add_argument("--bytes", type=int, default=5_000_000)
    burst.add_argument("--repeat", type=int, default=1)
    burst.add_argument("--gap", type=float, default=0.2, help="seconds between bursts")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.run(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
