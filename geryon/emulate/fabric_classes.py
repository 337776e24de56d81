"""A QoS profile on every egress of an emulated cluster: the fabric classes of jobs sharing it.

`EmulatedCluster` programs each egress with its own priority classes (strict levels, `geryon.netconf.plan`).
Jobs sharing a fabric need the fabric's profile instead (`geryon.netconf.tenants`: urgent levels, bulk,
background with its guaranteed floor), programmed as the Linux target renders it
(`geryon.netconf.render.linux.build_plan`, HTB at each link's rate), on hosts and switch ports alike, so
the emulated switch carries what a real one would be given.

    with EmulatedCluster("t1", hosts=3, bw="100mbit") as cluster:
        install_profile(cluster, load_profile("cluster/profiles/tenants.toml"))
"""

from dataclasses import replace

from geryon.netconf import apply_plan
from geryon.netconf.plan import QueuePlan
from geryon.netconf.qos_profile import QosProfile
from geryon.netconf.render.linux import build_plan


def install_profile(cluster, profile: QosProfile) -> list[QueuePlan]:
    """Replace the queues of every link end of `cluster` (an up EmulatedCluster) by `profile`'s, at the
    link's rate; return the applied plans. `EmulatedCluster.down()` removes them with the namespaces."""
    plans = []
    for link in cluster.topology.links:
        for end in (link.a, link.b):
            plan = build_plan(replace(profile, rate=link.rate), end.dev, end.netns)
            apply_plan(plan)
            plans.append(plan)
    return plans
