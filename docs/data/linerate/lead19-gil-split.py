"""Split a py-spy `--gil --format raw` record of a bench by Python function: only samples of the geryon
ring ranks (`transport_roles allreduce`), set-up and imports set apart; self (leaf) and inclusive counts.

    py-spy record --gil --subprocesses --format raw -r 200 -o gil.txt -- python -m geryon bench \\
        allreduce --workers 4 --sizes 1e8 --repeat 2 --bw 100mbit --congestion reno --no-wire-ring
    python docs/data/linerate/lead19-gil-split.py gil.txt
"""
import collections
import re
import sys

inclusive, leaf = collections.Counter(), collections.Counter()
total = setup = 0
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(" ")
    if not count.isdigit() or "transport_roles allreduce" not in stack:
        continue
    n = int(count)
    frames = [re.sub(r":\d+\)", ")", f) for f in stack.split(";") if not f.startswith("process")]
    if not frames:
        continue
    if "_find_and_load" in stack or not any("flows.py" in f or "run_allreduce" in f for f in frames):
        setup += n
        continue
    total += n
    leaf[frames[-1]] += n
    for frame in set(frames):
        inclusive[frame] += n
print(f"geryon ranks' samples holding the GIL: {total} in the transport and the bench loop, {setup} in set-up")
print("--- self")
for name, n in leaf.most_common(30):
    print(f"{n:6d} {100 * n / total:5.1f}% {name}")
print("--- inclusive")
for name, n in inclusive.most_common(45):
    print(f"{n:6d} {100 * n / total:5.1f}% {name}")
