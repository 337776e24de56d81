"""`geryon ...` (a bench, the priority check) with HTB buckets of tc's default size ("old": one
1600 B frame) or geryon's ("new": 1 ms of the rate and a frame).

    python docs/data/linerate/lead18-burst-ab.py old bench allreduce --workers 8 --sizes 1e8 --bw 1gbit --json

The emulated cluster's queues are built in this process, so setting the bucket size here reaches every
port; each JSON result (a line, or one indented object) is printed on one line, tagged with "htb_burst".
"""
import contextlib
import io
import json
import sys

import geryon.netconf.plan as plan
from geryon.cli import main

which, argv = sys.argv[1], sys.argv[2:]
if which == "old":
    plan.HTB_BURST_SECONDS = 0.0  # rate / 1e9 + mtu rounds to one frame, as tc computes it here
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(argv)
try:
    results = [json.loads(out.getvalue())]
except json.JSONDecodeError:
    results = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
for result in results:
    print(json.dumps({"htb_burst": which, **result}))
sys.exit(code)
