"""An emulated cluster: hosts in network namespaces behind software switches with priority queues.

Each host is a namespace `gy<name>-h<i>` with one interface `eth0` (10.199.0.i/16); each switch is a
namespace holding a Linux bridge. Every link is shaped at the cluster rate in both directions, with
geryon's DSCP priority queues (`geryon.netconf`) on every egress unless priority is off.

Modules, one job each:
  topology.py  topologies as plain data (star, leafspine), names and addresses
  fabric.py    applies a topology to the kernel (namespaces, veths, bridges) and removes it
  state.py     JSON records of running clusters, so other processes can exec/down/list them
  cluster.py   EmulatedCluster: the life cycle, running commands in hosts, describe()
  clean.py     removes everything geryon made (`geryon emulate clean`), also after a crash
  cli.py       `geryon emulate up|exec|down|list|clean`

    from geryon.emulate import EmulatedCluster
    with EmulatedCluster("demo", hosts=3, bw="100mbit") as cluster:
        cluster.run("h1", ["ping", "-c1", cluster.host("h2").ip])

Segmentation offload (GSO/TSO) stays on by default: TCP then hands 64 KB super-packets through the
bridge and HTB schedules them whole; priority holds as well as without it (docs/transport.md) at a
fraction of the CPU. Pass `offload=False` (`--no-offload`) where a single high-priority packet must
never wait behind a 64 KB low one (up to 5 ms at 100 Mbit/s): the veths are then created with
gso_max_segs 1 (MTU packets).

Every link runs at MTU 1500 unless `mtu=` (`--mtu`) says otherwise, e.g. 9000 for the jumbo frames
of datacenter clusters; HTB's rate holds with 9000-byte frames (docs/transport.md).
"""

from geryon.emulate.clean import clean
from geryon.emulate.cluster import EmulatedCluster, Host

__all__ = ["EmulatedCluster", "Host", "clean"]
