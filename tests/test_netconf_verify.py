"""The DSCP sniffer: marks of real traffic from a namespace, seen in another namespace."""

import pytest

from geryon.errors import InterfaceNotFound, NetconfError
from geryon.netconf.verify import DscpSniffer, sniff_dscp
from netconf_pair import send_tcp, send_udp

pytestmark = pytest.mark.root


def test_sniffer_reports_packets_and_bytes_per_source_and_dscp(veth_pair):
    pair = veth_pair
    with DscpSniffer(pair.right_ns, pair.right_dev, bpf_filter="udp") as sniffer:
        send_udp(pair.left_ns, pair.right_ip, 46, count=30, size=1000)
        send_udp(pair.left_ns, pair.right_ip, 0, count=20, size=500)
        send_udp(pair.left_ns, pair.right_ip6, 26, count=10, size=100)
    result = sniffer.result()
    assert result.packets(source=pair.left_ip, dscp=46) == 30
    assert result.bytes(source=pair.left_ip, dscp=46) == 30 * (1000 + 8 + 20 + 14)  # UDP+IP+Ethernet
    assert result.packets(source=pair.left_ip, dscp=0) == 20
    assert result.packets(source=pair.left_ip6, dscp=26) == 10
    assert result.dscps(pair.left_ip) == {0, 46}
    assert result.as_dict()["marks"][0].keys() == {"source", "dscp", "packets", "bytes"}


def test_sniffer_sees_the_marks_of_a_tcp_stream(veth_pair):
    pair = veth_pair
    sniffer = DscpSniffer(pair.right_ns, pair.right_dev, bpf_filter="tcp port 5999").start()
    try:
        assert send_tcp(pair, 46, 200_000) == 200_000
    finally:
        result = sniffer.stop()
    assert result.dscps(pair.left_ip) == {46}  # SYN, data and FIN all carry the mark
    assert result.bytes(source=pair.left_ip, dscp=46) >= 200_000


def test_sniff_for_a_duration_or_count(veth_pair):
    pair = veth_pair
    result = sniff_dscp(pair.right_ns, pair.right_dev, duration=0.3, bpf_filter="udp")
    assert result.marks == () and 0.2 <= result.duration_s < 5
    sniffer = DscpSniffer(pair.right_ns, pair.right_dev, bpf_filter="udp", count=5, duration=30).start()
    send_udp(pair.left_ns, pair.right_ip, 10, count=20, size=100)
    result = sniffer.wait(timeout=30)
    assert result.packets() == 5 and result.duration_s < 30


def test_sniffer_errors_are_typed(veth_pair):
    pair = veth_pair
    with pytest.raises(InterfaceNotFound):
        DscpSniffer(pair.right_ns, "gynothere").start()
    with pytest.raises(InterfaceNotFound):
        DscpSniffer(pair.right_ns + "x", pair.right_dev).start()
    with pytest.raises(NetconfError, match="filter"):
        DscpSniffer(pair.right_ns, pair.right_dev, bpf_filter="udp and (").start()
    sniffer = DscpSniffer(pair.right_ns, pair.right_dev)
    with pytest.raises(NetconfError, match="never started"):
        sniffer.stop()
