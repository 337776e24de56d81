"""See the marks on the wire: packets and bytes per (source IP, DSCP) captured on an interface.

    with DscpSniffer("gyrun-h2", "eth0", bpf_filter="udp") as sniffer:
        ...  # send traffic
    result = sniffer.result()      # SniffResult
    result.packets(source="10.199.0.1", dscp=46)

The capture runs in a child process (`geryon.netconf.sniff`) entered into the namespace with
`ip netns exec`, so the caller's own namespace never changes. `start()` returns once the capture socket
is open, so traffic sent after it is seen; `stop()` first drains what the kernel already captured.
Bytes are Ethernet header plus IP length; with GSO on (the veth default) the capture sees ~64 KB
super-packets, so compare flows by bytes, not packets.
"""

import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from geryon.childproc import ChildProcess
from geryon.errors import InterfaceNotFound, NetconfError, require_root
from geryon.netconf.state import netns_inode



@dataclass(frozen=True)
class MarkCount:
    """Traffic from one source carrying one DSCP."""

    source: str
    dscp: int
    packets: int
    bytes: int


@dataclass(frozen=True)
class SniffResult:
    """What a capture saw, by (source, DSCP)."""

    iface: str
    netns: str | None
    duration_s: float
    marks: tuple[MarkCount, ...]
    other_packets: int = 0  # ARP and other non-IP frames
    bpf_filter: str | None = None

    def packets(self, source: str | None = None, dscp: int | None = None) -> int:
        """Packets matching source and/or DSCP (None matches any)."""
        return sum(mark.packets for mark in self._select(source, dscp))

    def bytes(self, source: str | None = None, dscp: int | None = None) -> int:
        """Bytes matching source and/or DSCP (None matches any)."""
        return sum(mark.bytes for mark in self._select(source, dscp))

    def dscps(self, source: str | None = None) -> set[int]:
        """The DSCP values seen (from one source, or from any)."""
        return {mark.dscp for mark in self._select(source, None)}

    def _select(self, source, dscp):
        return [mark for mark in self.marks
                if (source is None or mark.source == source) and (dscp is None or mark.dscp == dscp)]

    def as_dict(self) -> dict:
        record = asdict(self)
        record["marks"] = [asdict(mark) for mark in self.marks]
        return record


@dataclass
class DscpSniffer:
    """A capture on `iface` in `netns` (None: this process's namespace), as a context manager or start/stop."""

    netns: str | None
    iface: str
    bpf_filter: str | None = None
    count: int | None = None  # stop by itself after this many packets
    duration: float | None = None  # stop by itself after this many seconds
    ready_timeout: float = 30.0
    _process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _child: ChildProcess | None = field(default=None, init=False, repr=False)
    _result: SniffResult | None = field(default=None, init=False, repr=False)

    def start(self) -> "DscpSniffer":
        """Start capturing; returns when the capture socket is open."""
        if self._process is not None:
            raise NetconfError("this sniffer was already started; make a new DscpSniffer")
        _check_target(self.netns, self.iface)
        argv = [sys.executable, "-m", "geryon.netconf.sniff", "--iface", self.iface]
        if self.bpf_filter:
            argv += ["--filter", self.bpf_filter]
        if self.count:
            argv += ["--count", str(self.count)]
        if self.duration is not None:
            argv += ["--duration", str(self.duration)]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        self._child = ChildProcess.start(argv, name=f"sniffer on {self.iface!r}", error=NetconfError)
        self._process = self._child.process
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        try:
            line = self._child.next_line(self.ready_timeout)
        except NetconfError as exc:
            self._child.close()
            raise NetconfError(f"sniffer on {self.iface!r} did not start: {exc}") from None
        if line.strip() != "READY":
            self._child.close()
            raise NetconfError(f"sniffer on {self.iface!r} did not start: {self._child.stderr_tail()}")

    def stop(self, timeout: float = 30.0) -> SniffResult:
        """Stop capturing (if still running) and return the result."""
        if self._result is not None:
            return self._result
        if self._process is None:
            raise NetconfError("the sniffer was never started")
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        return self._collect(timeout)

    def wait(self, timeout: float | None = None) -> SniffResult:
        """Wait until the capture ends by itself (count or duration reached) and return the result."""
        if self._process is None:
            raise NetconfError("the sniffer was never started")
        if self._result is None:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.stop()

    def result(self) -> SniffResult:
        """The result of a stopped capture."""
        if self._result is None:
            raise NetconfError("the sniffer is still running: call stop() or leave the with-block first")
        return self._result

    def _collect(self, timeout: float) -> SniffResult:
        try:
            records = self._child.finish(timeout)
        finally:
            self._child.close()
        if not records:
            raise NetconfError(f"sniffer on {self.iface!r} failed: {self._child.stderr_tail()}")
        record = records[-1]
        self._result = SniffResult(
            iface=self.iface, netns=self.netns, duration_s=record["duration_s"],
            marks=tuple(MarkCount(**mark) for mark in record["marks"]),
            other_packets=record["other_packets"], bpf_filter=self.bpf_filter)
        return self._result

    def _kill(self) -> None:
        if self._child is not None:
            self._child.close()

    def __enter__(self) -> "DscpSniffer":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stop()
        else:
            self._kill()


def sniff_dscp(netns: str | None, iface: str, duration: float = 5.0, count: int | None = None,
               bpf_filter: str | None = None) -> SniffResult:
    """Capture for `duration` seconds (or until `count` packets) and return what was seen."""
    sniffer = DscpSniffer(netns, iface, bpf_filter, count=count, duration=duration)
    sniffer.start()
    return sniffer.wait(duration + 30)


def _check_target(netns: str | None, iface: str) -> None:
    require_root("sniffing (raw sockets, entering namespaces)")
    if netns and netns_inode(netns) is None:
        raise InterfaceNotFound(f"network namespace {netns!r} does not exist (see `ip netns list`)")
    check = ["ip", *(["-n", netns] if netns else []), "link", "show", "dev", iface]
    if subprocess.run(check, capture_output=True).returncode != 0:
        where = f"namespace {netns!r}" if netns else "this namespace"
        raise InterfaceNotFound(f"interface {iface!r} does not exist in {where}")
