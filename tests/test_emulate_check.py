"""The priority check: a short real run on emulated clusters, its CLI, its table and its input errors."""

import json
import os
import subprocess
import sys

import pytest

from geryon.cli import build_parser
from geryon.emulate import check
from geryon.errors import ConfigError, EmulationError


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "geryon", "emulate", "check", *args],
                          capture_output=True, text=True, timeout=240)


def _priority_holds(result: dict) -> bool:
    with_queues = next(c for c in result["configurations"] if c["priority"])
    return with_queues["contention"]["high_share"] >= 0.8 and with_queues["burst"]["ratio"] <= 1.3


@pytest.fixture(scope="module")
def cli_run():
    """One short `geryon emulate check --json` (bbr only); a second try if a busy machine spoiled it."""
    for _ in range(2):
        done = _run_cli("--json", "--congestion", "bbr", "--duration", "3")
        assert done.returncode in (0, 1), done.stderr
        result = json.loads(done.stdout)
        if _priority_holds(result):
            break
    return done, result


@pytest.mark.root
@pytest.mark.slow
def test_check_reports_every_configuration(cli_run):
    done, result = cli_run
    assert result["bw_bps"] == 100_000_000 and result["burst_bytes"] == 5_000_000
    assert [(c["congestion"], c["priority"]) for c in result["configurations"]] == [("bbr", True), ("bbr", False)]
    for config in result["configurations"]:
        contention, burst = config["contention"], config["burst"]
        assert contention["high"]["dscp"] == 46 and contention["low"]["dscp"] == 0
        assert contention["high"]["congestion"] == contention["low"]["congestion"] == "bbr"
        total = contention["high"]["throughput_bps"] + contention["low"]["throughput_bps"]
        assert 0.7 * 100e6 < total < 1.05 * 100e6  # the port is full, and never faster than its rate
        assert len(burst["alone_times_s"]) == len(burst["contended_times_s"]) == 3
        assert burst["ratio"] == pytest.approx(burst["contended_s"] / burst["alone_s"])
        assert contention["counters"] and all("bytes" in row and "drops" in row for row in contention["counters"])
        assert set(config["verdict"]) == {"share", "burst", "ok"}
    assert result["ok"] == all(c["verdict"]["ok"] for c in result["configurations"])
    assert done.returncode == (0 if result["ok"] else 1)
    assert "check: bbr" in done.stderr  # progress goes to stderr, the JSON alone to stdout


@pytest.mark.root
@pytest.mark.slow
def test_priority_holds_with_queues_and_not_without(cli_run):
    _, result = cli_run
    with_queues, without = result["configurations"]
    assert with_queues["contention"]["high_share"] >= 0.8, with_queues["contention"]
    assert with_queues["burst"]["ratio"] <= 1.3, with_queues["burst"]
    by_class = {row["name"]: row for row in with_queues["contention"]["counters"]}
    assert by_class["high"]["bytes"] > 5 * by_class["low"]["bytes"]
    assert 0.2 <= without["contention"]["high_share"] <= 0.8, without["contention"]


@pytest.mark.root
@pytest.mark.slow
def test_table_shows_each_configuration_and_the_result(cli_run):
    table = check.format_table(cli_run[1])
    assert "bbr    priority" in table and "bbr    none" in table
    assert ("priority holds" in table) == cli_run[1]["ok"]


def _check_namespaces() -> set[str]:
    return {n for n in os.listdir("/run/netns") if n.startswith("gyck")} if os.path.isdir("/run/netns") else set()


@pytest.mark.root
def test_a_failing_sender_is_reported_and_the_cluster_removed():
    before = _check_namespaces()
    with pytest.raises(EmulationError, match="nosuchcc"):
        check.run_check(duration=2, congestion=("nosuchcc",), priorities=(True,), progress=None)
    assert _check_namespaces() <= before


def _configuration(priority: bool, share: float, ratio: float) -> dict:
    return {"priority": priority, "contention": {"high_share": share}, "burst": {"ratio": ratio}}


@pytest.mark.parametrize("priority, share, ratio, ok", [
    (True, 0.99, 1.02, True), (True, 0.85, 1.02, False), (True, 0.99, 1.2, False),
    # without queues a FIFO gives no preference, whichever way the split falls (cubic: 7% to 65% measured)
    (False, 0.50, 3.0, True), (False, 0.07, 3.0, True), (False, 0.65, 3.0, True),
    (False, 0.95, 3.0, False), (False, 0.50, 1.05, False),
])
def test_verdict_asks_for_priority_with_queues_and_none_without(priority, share, ratio, ok):
    verdict = check._verdict(_configuration(priority, share, ratio))
    assert verdict["ok"] is ok
    assert verdict["ok"] == (verdict["share"]["ok"] and verdict["burst"]["ok"])


def test_duration_must_exceed_the_warmup():
    with pytest.raises(ConfigError, match="--duration"):
        check.run_check(duration=0.5)


def test_bad_congestion_list_is_a_config_error():
    with pytest.raises(ConfigError):
        check._parse_congestion(" , ")
    assert check._parse_congestion("bbr, cubic") == ("bbr", "cubic")


def test_check_and_demo_commands_are_registered():
    parser = build_parser()
    args = parser.parse_args(["emulate", "check", "--bw", "50mbit", "--json"])
    assert (args.bw, args.json, args.duration, args.congestion) == ("50mbit", True, 4.0, "bbr,cubic")
    assert args.func is check.run_from_args
    demo = parser.parse_args(["demo"])
    assert demo.func and not demo.json
