"""Timelines: per-rank parts of a Chrome/Perfetto trace, merged by the launcher into one valid file."""

import json
import os

import pytest
import torch

from geryon.timeline import RankTimeline, merge_parts, part_path, rank_pid
from geryon.transport.trace import TransferEvent
from launch_support import EXAMPLE, EXAMPLE_ARGS, run_launcher


def _event(kind, t, cls=0, tensor=3, offset=0, peer="server 0", flow="server 0 (flow 0)"):
    return TransferEvent(kind=kind, peer=peer, cls=cls, flow=flow, tensor_id=tensor, offset=offset,
                         nbytes=1024, t=t, iteration=1)


def test_transfers_become_queued_wire_and_received_spans(tmp_path):
    timeline = RankTimeline(str(tmp_path / "trace.json"), "worker1")
    for kind, t in (("queued", 10.0), ("send_start", 10.5), ("send_done", 10.75)):
        timeline.transfer(_event(kind, t))
    timeline.transfer(_event("recv_done", 11.0, cls=1, flow="server 0 (flow 1)"))
    events = timeline.events
    wire = [e for e in events if e["ph"] == "X"]
    assert len(wire) == 1 and wire[0]["ts"] == 10.5e6 and wire[0]["dur"] == 0.25e6
    assert wire[0]["cat"] == "wire,class0" and wire[0]["pid"] == rank_pid("worker1") == 2
    queued = [e for e in events if e["ph"] in "be"]
    assert [e["ph"] for e in queued] == ["b", "e"] and queued[0]["id"] == queued[1]["id"]
    assert queued[1]["ts"] - queued[0]["ts"] == 0.5e6
    received = [e for e in events if e["ph"] == "i"]
    assert received[0]["cat"] == "received,class1" and received[0]["tid"] != wire[0]["tid"]
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"compute (forward/backward per layer)", "send to server 0, class 0",
                     "recv from server 0, class 1"}


def test_module_spans_and_merge(tmp_path):
    path = str(tmp_path / "trace.json")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    worker = RankTimeline(path, "worker0")
    worker.watch_module(model)
    model(torch.randn(3, 4)).sum().backward()
    server = RankTimeline(path, "server0")
    server.transfer(_event("recv_done", 1.0, peer="worker 0"))
    worker.save()
    server.save()
    assert os.path.exists(part_path(path, "worker0"))
    assert merge_parts(path) == len(worker.events) + len(server.events)
    assert not os.path.exists(part_path(path, "worker0"))
    with open(path) as handle:
        trace = json.load(handle)
    spans = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert spans == {"forward 0", "forward 1", "forward 2", "backward 0", "backward 1", "backward 2"}
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert processes == {1: "worker0", 1001: "server0"}
    assert sorted(trace["otherData"]["ranks"]) == ["server0", "worker0"]


@pytest.mark.slow
def test_launcher_writes_a_merged_trace_of_a_ps_job(tmp_path):
    path = tmp_path / "job.json"
    args = [a if a != "20" else "3" for a in EXAMPLE_ARGS]
    result = run_launcher("--local", "--mode", "ps", "--servers", "1", "--workers", "2", "--policy", "geryon",
                          "--timeline", path, EXAMPLE, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"written to {path}" in result.stderr
    with open(path) as handle:
        trace = json.load(handle)
    events = trace["traceEvents"]
    assert list(tmp_path.iterdir()) == [path]  # the parts are gone
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes.values()) == ["server0", "worker0", "worker1"]
    for worker in ("worker0", "worker1"):
        pid = rank_pid(worker)
        cats = {e.get("cat") for e in events if e["pid"] == pid}
        assert {"forward", "backward", "wait"} <= cats
        assert {"wire,class0", "wire,class1", "received,class0", "received,class1"} <= cats
    server_cats = {e.get("cat") for e in events if e["pid"] == rank_pid("server0")}
    assert {"wire,class0", "wire,class1", "queued,class1"} <= server_cats
    for event in events:
        assert event["ph"] in "XbeiM" and isinstance(event["pid"], int)
        if event["ph"] != "M":
            assert event["ts"] > 1e15  # microseconds of time.time()
