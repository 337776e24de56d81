"""`geryon netconf ...` end to end: dry-run show without root, then apply/stats/verify/remove on a veth."""

import argparse
import json
import threading

import pytest

from geryon.errors import ClassSpecError, ConfigError, InterfaceNotFound, RateError
from geryon.netconf import cli
from netconf_pair import send_udp


def run(argv: list[str]) -> int:
    """Parse and run like `geryon` does (errors propagate as the typed exceptions it prints)."""
    parser = argparse.ArgumentParser(prog="geryon")
    commands = parser.add_subparsers(dest="command")
    bench = commands.add_parser("bench").add_subparsers()
    cli.add_commands(commands, bench)
    args = parser.parse_args(argv)
    return args.func(args)


def test_show_prints_tc_lines_without_applying(capsys):
    assert run(["netconf", "show", "--dev", "gy0", "--rate", "100mbit", "--classes", "high:46,low:0"]) == 0
    out = capsys.readouterr().out
    assert "tc qdisc add dev gy0 root handle 1: htb default 11" in out
    assert "match ip dsfield 0xb8 0xfc flowid 1:10" in out


def test_show_json_and_shaping(capsys):
    run(["netconf", "show", "--dev", "gy0", "--rate", "1gbit", "--classes", "4", "--netns", "gyx", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["layout"] == "htb" and len(plan["classes"]) == 4 and plan["rate"] == 10**9
    assert all(line.startswith("tc -n gyx ") for line in plan["commands"])
    run(["netconf", "show", "--dev", "gy0", "--rate", "1gbit", "--shaping-only"])
    assert "dsfield" not in capsys.readouterr().out


@pytest.mark.parametrize("argv, error", [
    (["--classes", "9"], ClassSpecError),
    (["--classes", "a:46,b:46"], ClassSpecError),
    (["--classes", "a:99"], ClassSpecError),
    (["--rate", "lots"], RateError),
    (["--shaping-only"], ConfigError),
])
def test_show_rejects_bad_input(argv, error):
    with pytest.raises(error):
        run(["netconf", "show", "--dev", "gy0", *argv])


def test_capabilities_json(capsys):
    assert run(["netconf", "capabilities", "--json"]) == 0
    capabilities = json.loads(capsys.readouterr().out)
    assert "htb" in capabilities["qdiscs"] and "u32" in capabilities["classifiers"]


@pytest.mark.root
def test_apply_stats_verify_remove(veth_pair, capsys):
    pair = veth_pair
    left = ["--dev", pair.left_dev, "--netns", pair.left_ns]
    assert run(["netconf", "apply", *left, "--rate", "100mbit", "--classes", "3"]) == 0
    assert "tc -n" in capsys.readouterr().out
    send_udp(pair.left_ns, pair.right_ip, 46, count=10, size=1000)
    run(["netconf", "stats", *left, "--json"])
    stats = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in stats] == ["high", "medium", "low"] and stats[0]["bytes"] >= 10_000
    run(["netconf", "stats", *left])
    assert "high" in capsys.readouterr().out

    done = threading.Event()

    def keep_sending():  # the capture starts at an unknown moment under load: send until it ends
        while not done.wait(0.3):
            send_udp(pair.left_ns, pair.right_ip, 34, 10, 200)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        run(["netconf", "verify", "--netns", pair.right_ns, "--iface", pair.right_dev, "--duration", "2",
             "--filter", "udp", "--json"])
    finally:
        done.set()
        sender.join()
    seen = {(m["source"], m["dscp"]): m for m in json.loads(capsys.readouterr().out)["marks"]}
    marked = seen[(pair.left_ip, 34)]
    assert marked["packets"] >= 10 and marked["bytes"] == marked["packets"] * (200 + 8 + 20 + 14)

    assert run(["netconf", "remove", *left]) == 0
    run(["netconf", "stats", *left])
    assert "no classes" in capsys.readouterr().out
    with pytest.raises(InterfaceNotFound):
        run(["netconf", "apply", "--dev", "gynothere", "--netns", pair.left_ns, "--rate", "1mbit"])
