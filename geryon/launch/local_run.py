"""Local backend: every rank is a child process of the launcher on this machine, talking over loopback."""

import os
import subprocess

from geryon.launch.config import LaunchConfig
from geryon.launch.environment import job_environment, local_world_sizes, merged_environment, rank_argv
from geryon.launch.orphans import exit_with_launcher
from geryon.launch.placement import RankSpec, place_on_one_host
from geryon.launch.rendezvous import hosted_store
from geryon.launch.supervise import JobResult, PopenRank, RankProcess, supervise
from geryon.launch.template import rank_template

LOOPBACK = "127.0.0.1"


def run_job(config: LaunchConfig, out=None, err=None) -> JobResult:
    """Run the job as local processes; returns when every rank is gone."""
    specs = place_on_one_host(config)
    workers_here = local_world_sizes(specs).get(0, 0)
    with rank_template(config) as template, hosted_store(LOOPBACK) as port:
        def start(spec: RankSpec) -> RankProcess:
            env = merged_environment(os.environ, job_environment(
                config, spec, LOOPBACK, port, workers_here, host_ip=LOOPBACK, iface="lo"))
            if template:
                return template.spawn(spec, rank_argv(config, spec), env)
            process = subprocess.Popen(rank_argv(config, spec), env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True, preexec_fn=exit_with_launcher())
            return PopenRank(spec, process)

        return supervise(specs, start, config.grace, config.timeout, out, err)
