"""Bytes in flight per connection into the first worker's host while `geryon bench tenants` runs.

    sudo .venv/bin/python probe_inflight.py vgg19,resnet50:allreduce vanilla,endhost inflight-ss.json

Runs one repetition of the bench's segments for the given jobs and policies (background on) and, during
each, samples `ss -tin` in every host but h1 every few milliseconds. For each connection into h1 (the
ring from h2, the PS pulls from the servers, the background from the last host) it keeps (cwnd,
unacked segments, rtt ms, notsent bytes) and prints, per connection, the median over its busy samples
(unacked > 0). The raw samples go to the JSON file: {policy: {"host lport->pport": [[cwnd, unacked, rtt,
notsent], ...]}}.
"""
import json
import re
import statistics
import sys
import threading
import time

import geryon.bench.tenants as tenants


def main() -> None:
    models, policies, out = tuple(sys.argv[1].split(",")), tuple(sys.argv[2].split(",")), sys.argv[3]
    settings = tenants.TenantSettings(models=models, workers=2, iterations=10, warmup=2, repetitions=1,
                                      background=True, policies=policies)
    bench = tenants.TenantsBench(settings)
    samples, raw = [], {}
    stop = threading.Event()

    def sample(cluster, hosts, target):
        while not stop.is_set():
            for host in hosts:
                lines = cluster.run(host, ["ss", "-tin", "state", "established"], timeout=10,
                                    capture_output=True, text=True).stdout.splitlines()
                for head, info in zip(lines, lines[1:]):
                    if "cwnd" not in info or head.split()[-1].rsplit(":", 1)[0] != target:
                        continue
                    local, peer = head.split()[-2:]
                    field = {k: re.search(rf"{k}:([\d.]+)", info) for k in ("cwnd", "unacked", "rtt", "notsent")}
                    samples.append((f"{host} {local.rsplit(':', 1)[1]}->{peer.rsplit(':', 1)[1]}",
                                    [float(m.group(1)) if m else 0.0 for m in field.values()]))
            time.sleep(0.005)

    bench.start()
    try:
        for policy in policies:
            samples.clear()
            stop.clear()
            hosts = [h.name for h in bench.cluster.hosts if h.name != "h1"]
            thread = threading.Thread(target=sample, args=(bench.cluster, hosts, bench.cluster.host("h1").ip))
            thread.start()
            row = bench.segment(policy)
            stop.set()
            thread.join()
            print(tenants.row_line(row), flush=True)
            per = raw[policy] = {}
            for key, values in samples:
                per.setdefault(key, []).append(values)
            for key, values in sorted(per.items()):
                busy = [v for v in values if v[1] > 0]
                if len(busy) >= 3:
                    cwnd = statistics.median(v[0] for v in busy)
                    print(f"  {key:28} busy samples {len(busy):4}  cwnd median {cwnd:5.0f}"
                          f"  unacked median {statistics.median(v[1] for v in busy):5.0f}"
                          f" mean {statistics.mean(v[1] for v in busy):6.1f}"
                          f"  rtt median {statistics.median(v[2] for v in busy):6.2f} ms", flush=True)
    finally:
        bench.stop()
        with open(out, "w") as handle:
            json.dump(raw, handle)


if __name__ == "__main__":
    main()
