"""Run a command and add the machine's CPU seconds during it (every CPU, from /proc/stat) to its JSON lines.

    python docs/data/linerate/lead19-machine-cpu.py python docs/data/linerate/lead18-burst-ab.py new bench ...

Each JSON line the command prints comes out with "machine_cpu_s" (busy seconds of all CPUs together:
everything but idle and iowait, by kind in "machine_cpu_by_kind_s") and "machine_wall_s" for the whole
command. Two runs of one bench that move the same bytes can then be compared machine-wide, not only by
the CPU time their own processes are charged.
"""
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("htb_cpu", Path(__file__).with_name("lead19-htb-cpu.py"))
htb_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(htb_cpu)

before, began = htb_cpu.cpu_seconds(), time.monotonic()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
after, wall = htb_cpu.cpu_seconds(), time.monotonic() - began
spent = {kind: round(after[kind] - before[kind], 2) for kind in htb_cpu.KINDS if kind not in ("idle", "iowait")}
sys.stderr.write(done.stderr)
for line in done.stdout.splitlines():
    if line.startswith("{"):
        print(json.dumps({**json.loads(line), "machine_cpu_s": round(sum(spent.values()), 2),
                          "machine_cpu_by_kind_s": spent, "machine_wall_s": round(wall, 2)}))
sys.exit(done.returncode)
