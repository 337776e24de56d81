"""geryon under the engines clusters run (docs/engines.md), on an emulated cluster, with no geryon.launch.

Each host runs `torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint h1:PORT`, as
a Slurm batch script or a Kubernetes PyTorchJob would; the script only calls geryon.init() and
geryon.distribute(). Allreduce and PS (one server per node) train exactly as one process does, with
geryon's flows DSCP-marked per class, sniffed at the switch port toward h2. Then the same allreduce and
PS jobs are started as srun starts tasks: one process per rank, only Slurm's variables, no torchrun, the
job secret read from a file as a mounted secret would be.
"""

import os
import signal
import socket
import subprocess
import uuid

import pytest

from launch_support import EXAMPLE, EXAMPLE_ARGS, PYTHON, REPO, clean_env, json_records, loss_curve

pytestmark = [pytest.mark.root, pytest.mark.slow]

SECRET = "engines-test-secret"
HIGH_DSCP, LOW_DSCP = 46, 0         # the transport's default two classes (geryon.transport.config)
NODES, PER_NODE = 2, 2
JOB_TIMEOUT_S = 150
ITERATIONS = 8     # the first iterations of the example's curve (it has no schedule): short jobs, same check
ARGS = [*EXAMPLE_ARGS[:EXAMPLE_ARGS.index("--iterations")], "--iterations", str(ITERATIONS),
        *EXAMPLE_ARGS[EXAMPLE_ARGS.index("--iterations") + 2:]]


@pytest.fixture(scope="module")
def cluster():
    from geryon.emulate import EmulatedCluster

    with EmulatedCluster("e" + uuid.uuid4().hex[:5], hosts=NODES, bw="1gbit") as built:
        yield built


def _free_port() -> int:
    """A port to rendezvous on: free here, and so in the hosts' fresh namespaces (nothing listens there)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_env(**extra) -> dict[str, str]:
    return clean_env(GERYON_JOB_SECRET=SECRET, GLOO_SOCKET_IFNAME="eth0", GERYON_TRANSPORT_TIMEOUT="30",
                     PYTHONFAULTHANDLER="1", OMP_NUM_THREADS="1", **extra)


def _run_everywhere(cluster, commands: list[tuple[str, list[str], dict]]) -> list[subprocess.CompletedProcess]:
    """Start every (host, argv, env) at once, wait for all; every process is gone on return, even on failure."""
    processes = [cluster.popen(host, argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
                 for host, argv, env in commands]
    results = []
    try:
        for process, (_host, argv, _env) in zip(processes, commands):
            out, err = process.communicate(timeout=JOB_TIMEOUT_S)
            results.append(subprocess.CompletedProcess(argv, process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return results


def _torchrun_job(cluster, **settings) -> list[subprocess.CompletedProcess]:
    h1 = cluster.host("h1").ip
    port = _free_port()
    run_id = uuid.uuid4().hex[:8]

    def argv(host) -> list[str]:
        # torchrun names a node by its hostname, which every namespace shares with the machine: each host
        # is told which one hosts the rendezvous (is_host) and the address it is reached at (--local-addr)
        return [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--nproc-per-node", str(PER_NODE),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{h1}:{port}", "--rdzv-id", run_id,
                "--rdzv-conf", f"is_host={host.ip == h1},join_timeout=60", "--local-addr", host.ip,
                str(EXAMPLE), *ARGS]

    return _run_everywhere(cluster, [(host.name, argv(host), _rank_env(**settings)) for host in cluster.hosts])


def _sniffed(cluster, run):
    """(run's result, what the switch sent toward h2 from h1) around `run()`."""
    from geryon.netconf.verify import DscpSniffer

    netns, dev = cluster.switch_port("h2")
    with DscpSniffer(netns, dev, bpf_filter="tcp") as sniffer:
        results = run()
    return results, sniffer.result()


def _curve(results, mode: str, workers: int) -> list[float]:
    assert [r.returncode for r in results] == [0] * len(results), \
        "\n".join(r.stderr[-2500:] for r in results if r.returncode)
    records = [rec for r in results for rec in json_records(r.stdout.splitlines())]
    finals = [rec for rec in records if rec.get("final")]
    assert len(finals) == 1, "only worker 0 reports"
    assert (finals[0]["mode"], finals[0]["workers"]) == (mode, workers)
    return loss_curve(records)


def _urgent_bytes() -> int:
    """Bytes of the example's class-0 tensors (coarse classes: the layers before the classifier)."""
    from geryon.examples.train_cnn import SmallCNN

    width = int(ARGS[ARGS.index("--width") + 1])
    return sum(p.numel() * p.element_size() for p in SmallCNN(width).features.parameters())


def _assert_marked(sniffed, cluster) -> None:
    """h1 sent h2 geryon's urgent class marked 46 and everything else unmarked, nothing else.

    Every iteration the class-0 tensors cross from h1 to h2 at least once: the ring's edge between the
    hosts carries each of them, and in ps mode each slice is either pushed by h1's worker to h2's server
    or sent by h1's server to h2's worker.
    """
    h1 = cluster.host("h1").ip
    assert sniffed.dscps(source=h1) == {HIGH_DSCP, LOW_DSCP}
    assert sniffed.bytes(source=h1, dscp=HIGH_DSCP) >= ITERATIONS * _urgent_bytes()


def test_torchrun_allreduce_matches_one_process_with_marked_flows(cluster, single_curve):
    results, sniffed = _sniffed(cluster, lambda: _torchrun_job(cluster))
    assert _curve(results, "allreduce", NODES * PER_NODE) == pytest.approx(single_curve[:ITERATIONS], rel=1e-4,
                                                                           abs=1e-5)
    _assert_marked(sniffed, cluster)


def test_torchrun_ps_with_a_server_per_node_matches_one_process(cluster, single_curve):
    results, sniffed = _sniffed(cluster, lambda: _torchrun_job(cluster, GERYON_MODE="ps",
                                                               GERYON_SERVERS_PER_NODE="1"))
    assert _curve(results, "ps", NODES * (PER_NODE - 1)) == pytest.approx(single_curve[:ITERATIONS], rel=1e-4,
                                                                          abs=1e-5)
    out = "".join(r.stdout for r in results)
    assert out.count("every worker finished") == 2, out[-2000:]   # both servers served, then exited
    _assert_marked(sniffed, cluster)


def _slurm_job(cluster, secret_file, **settings) -> list[subprocess.CompletedProcess]:
    """srun's way: one process per rank with SLURM_* only (no torchrun), the secret from a mounted file;
    MASTER_ADDR/PORT name the job's store, which engine rank 0 (on h1) hosts."""
    secret_file.write_text(SECRET + "\n")
    job_id, port = str(uuid.uuid4().int % 100000), _free_port()
    commands = []
    for node, host in enumerate(cluster.hosts):
        for local in range(PER_NODE):
            env = _rank_env(SLURM_PROCID=str(node * PER_NODE + local), SLURM_NTASKS=str(NODES * PER_NODE),
                            SLURM_LOCALID=str(local), SLURM_NODEID=str(node), SLURM_NNODES=str(NODES),
                            SLURM_NTASKS_PER_NODE=str(PER_NODE), SLURM_JOB_ID=job_id,
                            MASTER_ADDR=cluster.host("h1").ip, MASTER_PORT=str(port),
                            GERYON_JOB_SECRET_FILE=str(secret_file), **settings)
            del env["GERYON_JOB_SECRET"]
            commands.append((host.name, [PYTHON, str(EXAMPLE), *ARGS], env))
    return _run_everywhere(cluster, commands)


def test_slurm_tasks_run_the_same_allreduce_job(cluster, single_curve, tmp_path):
    results, sniffed = _sniffed(cluster, lambda: _slurm_job(cluster, tmp_path / "secret"))
    assert _curve(results, "allreduce", NODES * PER_NODE) == pytest.approx(single_curve[:ITERATIONS], rel=1e-4,
                                                                           abs=1e-5)
    _assert_marked(sniffed, cluster)


def test_slurm_tasks_run_the_same_ps_job(cluster, single_curve, tmp_path):
    """The first two ranks (h1's) serve; engine rank 0, a server, hosts the job's store."""
    results, sniffed = _sniffed(cluster, lambda: _slurm_job(cluster, tmp_path / "secret", GERYON_MODE="ps",
                                                            GERYON_SERVERS="2"))
    assert _curve(results, "ps", NODES * PER_NODE - 2) == pytest.approx(single_curve[:ITERATIONS], rel=1e-4,
                                                                        abs=1e-5)
    assert all("every worker finished" in r.stdout for r in results[:2]), results[0].stdout[-2000:]
    _assert_marked(sniffed, cluster)
