"""geryon analyze on hand-built traces (written by the real timeline writer) with known answers."""

import pytest

from geryon.analyze.metrics import analyze, summary, union_length
from geryon.analyze.trace import load_trace
from geryon.cli import main
from geryon.timeline import RankTimeline, merge_parts
from geryon.transport.trace import TransferEvent

MB = 1_000_000


def build_trace(path, rounds=3):
    """Worker 0: forward 1 s, backward 2 s per 4 s round; push of tensor 0 (class 0) queued 0.5 s
    into backward, on the wire 1.0-1.5 s after it; server 0 sends the parameter back 3.0-3.5 s
    into the round; the worker receives it at 3.5 s."""
    worker, server = RankTimeline(str(path), "worker0"), RankTimeline(str(path), "server0")
    for k in range(rounds):
        t0 = 4.0 * k
        worker.span("forward conv", "forward", t0, t0 + 1)
        worker.span("backward conv", "backward", t0 + 1, t0 + 3)
        common = dict(peer="server 0 at 10.0.0.1:1", cls=0, flow="f0", tensor_id=0, offset=0,
                      nbytes=MB, iteration=k)
        worker.transfer(TransferEvent("queued", t=t0 + 1.5, **common))
        worker.transfer(TransferEvent("send_start", t=t0 + 2.0, **common))
        worker.transfer(TransferEvent("send_done", t=t0 + 2.5, **common))
        back = dict(common, peer="worker 0 at 10.0.0.2:1", iteration=k + 1)
        server.transfer(TransferEvent("queued", t=t0 + 3.0, **back))
        server.transfer(TransferEvent("send_start", t=t0 + 3.0, **back))
        server.transfer(TransferEvent("send_done", t=t0 + 3.5, **back))
        worker.transfer(TransferEvent("recv_done", t=t0 + 3.5, **dict(common, peer="server 0 at x",
                                                                       iteration=k + 1)))
    worker.save()
    server.save()
    merge_parts(str(path))
    return path


def test_union_length():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_length([(0, 2), (1, 3)], 1.5, 2.5) == 1.0


def test_known_iteration_metrics(tmp_path):
    analysis = analyze(load_trace(build_trace(tmp_path / "t.json")))
    assert len(analysis.rounds) == 2          # the last round has no end
    for r in analysis.rounds:
        assert r.T == pytest.approx(4.0) and r.C == pytest.approx(3.0)
        assert r.N == pytest.approx(1.0)      # push wire 0.5 s + parameter wire 0.5 s
        assert r.rho == pytest.approx(1 / 3)
        assert r.alpha == pytest.approx(0.0)  # T = C + N exactly: the formula sees no overlap
        assert r.U == pytest.approx(0.75) and r.U_formula == pytest.approx(0.75)
        assert r.feed_forward == pytest.approx(1.5)
        assert r.idle == pytest.approx(1.0)   # 3.0-4.0: nothing computed or sent
    tensor = analysis.tensors[0]
    assert tensor.bp_window == pytest.approx(0.5)
    assert tensor.reaction_bw == pytest.approx(MB / 0.5)
    assert tensor.immutable_worst_bw == pytest.approx(MB / 2.5)
    assert tensor.immutable_best_bw == pytest.approx(MB / 4.0)
    assert sorted(analysis.waits[0]) == pytest.approx([0.5] * 3 + [1.0] * 3)
    assert "rho 0.333, alpha 0.000, U = C/T 0.750" in summary(analysis)
    assert max(analysis.occupancy[0]) == pytest.approx(1.0)


def test_analyze_cli_writes_plots(tmp_path, capsys):
    trace = build_trace(tmp_path / "geryon.json")
    assert main(["analyze", str(trace), "--out", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "feed-forward 1500.0 ms" in out
    assert (tmp_path / "plots" / "urgent-wait.png").exists()
    assert (tmp_path / "plots" / "geryon-occupancy.png").exists()


def test_not_a_trace_is_a_typed_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"x\": 1}")
    assert main(["analyze", str(bad)]) == 1
    assert "not a Chrome trace" in capsys.readouterr().err
