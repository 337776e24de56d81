"""iperf3 goodput h1 -> h2 through the emulated 2-host star, with CPU hogs or not, HTB buckets as built or resized.

    python docs/data/linerate/lead18-htb-iperf3.py BW BURST HOGS SECONDS    # e.g. 1gbit 64kb 2 8

BURST "default" keeps the classes as geryon builds them; any other value (tc syntax: 1600, 64kb, 250kb) is
set as burst and cburst of every HTB class on every port with `tc class change` (quantum kept). Prints one
JSON line.
"""
import json
import re
import subprocess
import sys
import time

from geryon.emulate.cluster import EmulatedCluster
from geryon.netconf.plan import HTB_QUANTUM

CLASS_LINE = re.compile(r"class htb (\S+) (?:parent (\S+)|root)(?: leaf \S+)?(?: prio (\d+))? rate (\S+) ceil (\S+)")


def output(*argv) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout


def resize_buckets(cluster_name: str, burst: str) -> None:
    namespaces = [line.split()[0] for line in output("ip", "netns", "list").splitlines() if cluster_name in line]
    for ns in namespaces:
        for link in output("ip", "-n", ns, "-o", "link").splitlines():
            dev = link.split(":")[1].strip().split("@")[0]
            for line in output("tc", "-n", ns, "class", "show", "dev", dev).splitlines():
                match = CLASS_LINE.match(line)
                if not match:
                    continue
                classid, parent, prio, rate, ceil = match.groups()
                argv = ["tc", "-n", ns, "class", "change", "dev", dev, "classid", classid]
                argv += ["parent", parent] if parent else []
                argv += ["htb", "rate", rate, "ceil", ceil, "burst", burst, "cburst", burst,
                         "quantum", str(HTB_QUANTUM)]
                argv += ["prio", prio] if prio else []
                subprocess.run(argv, check=True)


def main() -> None:
    bw, burst, load, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    name = "gyhl"
    cluster = EmulatedCluster(name, hosts=2, bw=bw, tcp_congestion="reno").up()
    hogs, server = [], None
    try:
        if burst != "default":
            resize_buckets(name, burst)
        h1, h2 = cluster.hosts[0], cluster.hosts[1]
        server = subprocess.Popen(["ip", "netns", "exec", h2.netns, "iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(load)]
        report = json.loads(output("ip", "netns", "exec", h1.netns, "iperf3", "-c", h2.ip, "-t", str(secs), "-J",
                                   "-C", "reno"))
        goodput = report["end"]["sum_received"]["bits_per_second"]
        print(json.dumps({"bw": bw, "burst": burst, "hogs": load, "goodput_mbit": round(goodput / 1e6, 3)}))
    finally:
        for hog in hogs:
            hog.kill()
        if server:
            server.kill()
        cluster.down()


if __name__ == "__main__":
    main()
