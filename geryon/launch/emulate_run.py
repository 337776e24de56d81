"""Emulated-cluster backend: the job gets its own cluster of namespaces, one host per rank.

The cluster is named after the job id, sized to workers + servers, built with geryon's priority
queues when the policy is `geryon` (other policies get plain shaped FIFO links: their scheduling, if
any, happens at the end hosts), and removed when the job ends, whatever the ending. The launcher
hosts the rendezvous store inside the first worker's namespace (see geryon.launch.rendezvous).
"""

import os
import subprocess

from geryon.launch.config import LaunchConfig, emulated_host_count
from geryon.launch.environment import job_environment, merged_environment, rank_argv
from geryon.launch.orphans import exit_with_launcher
from geryon.launch.placement import RankSpec, place_one_per_host
from geryon.launch.rendezvous import hosted_store
from geryon.launch.supervise import JobResult, PopenRank, RankProcess, supervise
from geryon.launch.template import rank_template

# c10d warns on every connection that 10.199.x.y has no DNS name; in our namespaces none ever has.
QUIET_TORCH = {"TORCH_CPP_LOG_LEVEL": "ERROR"}


def build_cluster(config: LaunchConfig):
    """The (not yet built) EmulatedCluster for this job."""
    from geryon.emulate import EmulatedCluster  # lazy: pulls in pyroute2

    return EmulatedCluster(config.job_id, hosts=emulated_host_count(config.workers, config.servers),
                           bw=config.bw, classes=config.classes, priority=config.policy == "geryon",
                           topology=config.topology)


def run_job(config: LaunchConfig, out=None, err=None) -> JobResult:
    """Build the job's cluster, run every rank in its host, remove the cluster; returns at the end."""
    specs = place_one_per_host(config)
    quiet = {k: v for k, v in QUIET_TORCH.items() if k not in os.environ}
    os.environ.update(quiet)  # for the store the launcher hosts, and inherited by the ranks
    with rank_template(config) as template:   # forked before the cluster's and the store's threads start
        return _run_in_cluster(config, template, specs, out, err)


def _run_in_cluster(config: LaunchConfig, template, specs: list[RankSpec], out, err) -> JobResult:
    cluster = build_cluster(config)
    try:
        cluster.up()
        store_host = cluster.hosts[0]
        with hosted_store(store_host.ip, netns=store_host.netns) as port:
            def start(spec: RankSpec) -> RankProcess:
                host = cluster.hosts[spec.host]
                env = merged_environment(os.environ, job_environment(
                    config, spec, store_host.ip, port, 1, host_ip=host.ip, iface=host.iface))
                if template:
                    return template.spawn(spec, rank_argv(config, spec), env, netns=host.netns)
                process = cluster.popen(host, rank_argv(config, spec), env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True, preexec_fn=exit_with_launcher())
                return PopenRank(spec, process)

            return supervise(specs, start, config.grace, config.timeout, out, err)
    finally:
        cluster.down()
