#!/bin/bash
# perf the geryon ring ranks, then gloo's, of a 4 x 100 MB bench at 100 Mbit/s: 10 s of each, 20 s after they start
# (past imports, set-up and the untimed warm-up). Usage: flock /tmp/gy-cpu.lock bash lead19-perf-ranks.sh [OUTDIR]
# then: perf report -i OUTDIR/perf-allreduce.data --no-children --sort dso -g none --stdio
cd "$(git rev-parse --show-toplevel)"
source .venv/bin/activate
out=${1:-/tmp}
geryon bench allreduce --workers 4 --sizes 1e8 --repeat 2 --bw 100mbit --congestion reno --json > $out/perf-row.json 2>$out/perf-bench.err &
bench=$!
for role in "transport_roles allreduce" "transport_roles gloo"; do
  until pids=$(pgrep -d, -f "/.venv/bin/python -u -m geryon.bench.$role") && [ -n "$pids" ]; do sleep 0.2; done
  sleep 20   # past imports, set-up and the untimed warm-up collective (12.5 s)
  pids=$(pgrep -d, -f "/.venv/bin/python -u -m geryon.bench.$role")
  tag=${role#transport_roles }
  perf record -F 499 -g -p "$pids" -o $out/perf-$tag.data -- sleep 10 2>$out/perf-$tag.err
done
wait $bench
