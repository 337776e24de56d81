"""Allreduce and PS across emulated hosts; DSCP of each class confirmed on the receiving host."""

import hashlib

import pytest
import torch

from geryon.transport.allreduce import reference_allreduce_tensors
from geryon.bench.emulated import BASE_PORT, ring_placements, role_argv, run_roles
from geryon.bench.transport_roles import ps_params, allreduce_inputs

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def cluster(unique_name):
    from geryon.emulate import EmulatedCluster
    with EmulatedCluster(unique_name, hosts=3, bw="200mbit") as built:
        yield built


def test_allreduce_exact_and_marked_across_namespaces(cluster):
    from geryon.netconf.verify import DscpSniffer
    size, ranks = 300_001 * 4, 3
    h2 = cluster.host("h2")
    placements = ring_placements(cluster, ["h1", "h2", "h3"], ranks, "--sizes", size, "--iters", 1,
                                 "--checksum", "--two-classes", "--timeout", 30)
    with DscpSniffer(h2.netns, h2.iface, bpf_filter="tcp") as sniffer:
        records = run_roles(cluster, placements, timeout=120)
    result = sniffer.result()
    inputs = [allreduce_inputs(size, r, True)[0] for r in range(ranks)]
    want = reference_allreduce_tensors(inputs, [0, 1])
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in want)).hexdigest()
    for rank_records in records:
        assert [r["sha256"] for r in rank_records if r["event"] == "iteration"] == [digest]
    h1 = cluster.host("h1").ip   # h2's left neighbour: sends it both classes
    assert result.bytes(source=h1, dscp=46) > size // 8
    assert result.bytes(source=h1, dscp=0) > size // 2
    assert result.dscps(source=h1) <= {46, 0}


def test_ps_across_namespaces(cluster):
    sizes = "4000,400000"
    servers = [("h1", BASE_PORT + 1), ("h3", BASE_PORT + 3)]
    addresses = ",".join(f"{cluster.host(h).ip}:{p}" for h, p in servers)
    placements = [(h, role_argv("ps-server", "--index", i, "--servers", 2, "--workers", 2,
                                "--listen", f"0.0.0.0:{p}", "--sizes", sizes, "--timeout", 30))
                  for i, (h, p) in enumerate(servers)]
    placements += [("h2", role_argv("ps-worker", "--rank", w, "--workers", 2, "--servers", addresses,
                                    "--sizes", sizes, "--iters", 2, "--timeout", 30)) for w in (0, 1)]
    records = run_roles(cluster, placements, timeout=120)
    params = ps_params([4000, 400000])
    optimizer = torch.optim.SGD(params, lr=0.01)
    for _ in range(2):               # the mean of two workers' all-ones gradients is all ones
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer.step()
    want = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()
    for worker in records[2:]:
        assert [r["event"] for r in worker] == ["ready", "result"]
        assert worker[-1]["bytes_each_way"] == 404000
        assert worker[-1]["sha256"] == want
