#!/bin/bash
# Where one rank's CPU goes at 100 Mbit/s (twenty-fifth session): runs geryon's 4 x 100 MB row, and during
# rank 1's timed collectives takes (1) each thread's user and system ticks and context switches over 10 s
# (/proc/PID/task/*/stat and status) and (2) perf samples of the process for 15 s (cpu-clock, 1999 Hz).
# Run from the repository root, as root, under flock /tmp/gy-cpu.lock:
#     bash docs/data/linerate/lead25-rank-threads.sh OUT_PREFIX
# writes OUT_PREFIX-threads.txt (tid, ticks and switches over the 10 s) and OUT_PREFIX-perf.txt
# (perf report by thread and shared object).
set -euo pipefail
out=$1
python=${PYTHON:-.venv/bin/python}
$python -m geryon bench allreduce --workers 4 --sizes 1e8 --repeat 3 --bw 100mbit --congestion reno \
    --no-wire-ring --json > "$out-bench.jsonl" 2> "$out-bench.err" &
bench=$!
pid=""
for _ in $(seq 120); do
    pid=$(pgrep -f "transport_roles allreduce --rank 1 " | head -1 || true)
    [ -n "$pid" ] && break
    sleep 1
done
sleep 14                      # past the untimed warm-up, into the timed collectives
snapshot() {
    for task in /proc/"$pid"/task/*; do
        # utime and stime are fields 14 and 15 of stat (comm, field 2, is "python": no spaces)
        echo "$(basename "$task") $(awk '{print $14, $15}' "$task/stat") $(awk '/ctxt_switches/ {printf "%s ", $2}' "$task/status")"
    done
}
snapshot > "$out-threads-start.txt"
sleep 10
snapshot > "$out-threads-end.txt"
join "$out-threads-start.txt" "$out-threads-end.txt" | awk 'BEGIN {print "tid user_ticks system_ticks voluntary involuntary"}
    {print $1, $6 - $2, $7 - $3, $8 - $4, $9 - $5}' > "$out-threads.txt"
rm "$out-threads-start.txt" "$out-threads-end.txt"
perf record -F 1999 -e cpu-clock -g -p "$pid" -o "$out.perf.data" -- sleep 15 2> /dev/null
perf report -i "$out.perf.data" --no-children --sort pid,dso --stdio -g none 2> /dev/null | grep "%" > "$out-perf.txt"
rm -f "$out.perf.data"
wait $bench
