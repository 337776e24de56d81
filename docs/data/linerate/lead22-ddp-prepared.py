"""How many of the DDP hook's allreduce calls are served prepared (twenty-second session): the DDP
model test's training (tests/test_transport_ddp.py: a reference DDP model on gloo and a second one
whose buckets go through geryon_ddp_hook) on two ranks, with `PreparedCache.get` counted in each.

    python docs/data/linerate/lead22-ddp-prepared.py        (from the repository root)
"""
import json
import subprocess
import sys

if len(sys.argv) == 1:    # start the two ranks
    sys.path.insert(0, ".")
    from tests.transport_support import free_ports
    master, *ports = free_ports(3)
    ranks = [subprocess.Popen([sys.executable, __file__, str(r), str(master), ",".join(map(str, ports))],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    for rank in ranks:
        print(rank.communicate()[0].strip().splitlines()[-1])
    sys.exit(0)

sys.path.insert(0, ".")
import geryon.transport.prepared as prepared  # noqa: E402
from tests.test_transport_ddp import train  # noqa: E402

served = {"prepared": 0, "not": 0}
get = prepared.PreparedCache.get


def counted_get(self, *args):
    found = get(self, *args)
    served["prepared" if found is not None else "not"] += 1
    return found


prepared.PreparedCache.get = counted_get
rank, master, ports = int(sys.argv[1]), int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")]
result = train(rank, 2, master, ports)
print(json.dumps({"rank": rank, "hook calls prepared": served["prepared"], "not prepared": served["not"],
                  "bit_exact": result["bit_exact"], "buckets": result["buckets"]}))
