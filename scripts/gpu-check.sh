#!/usr/bin/env bash
# Run every CUDA/NCCL test of geryon on a machine with one GPU, and summarise the run.
#
#   scripts/gpu-check.sh [OUTDIR]        (default: $OUT if set, else ./gpu-check)
#
# Runs the tests marked `cuda` (pytest -m cuda, in the test files that use the marker: the NCCL class
# groups, CUDA tensors on geryon's flows, PS workers and servers on the GPU, CUDA training jobs in
# both modes), then the CUDA benches (geryon bench allreduce|transport --device cuda), with the
# machine's own python3 and packages, from this checkout (PYTHONPATH), installing nothing. The whole
# run is bounded to 8 minutes. Writes into OUTDIR:
#   gpu-check.md          the summary: machine, PyTorch, NCCL, each test's outcome (and skip reason),
#                         each bench's rows
#   gpu-check.json        the same as data
#   gpu-check-junit.xml   pytest's own report
#   gpu-check.log         pytest's output
#   bench-*.log, bench-*.jsonl   each CUDA bench's output and rows
# Exits 2 where no CUDA GPU is visible (saying so, with a summary that says so); else 0 when every
# test passed or was skipped with its reason and every bench ran, 1 otherwise.
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${OUT:-$REPO/gpu-check}}"
PYTHON="${PYTHON:-python3}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-300}"   # pytest's share of the 8 minutes
BENCH_S="${GPU_CHECK_BENCH_S:-150}"     # the CUDA benches' share; the rest is start-up and summary
mkdir -p "$DIR"
cd "$REPO" || exit 2
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        >"$DIR/gpu-check.log" 2>&1; then
    echo "gpu-check: no CUDA GPU found: torch.cuda.is_available() is false for $PYTHON; nothing was run." \
         "Run this on a machine with a GPU and a CUDA build of torch" >&2
    NO_GPU=1
fi

mapfile -t FILES < <(grep -l "pytest.mark.cuda" tests/test_*.py)
if [ "${#FILES[@]}" -eq 0 ]; then
    echo "gpu-check: no test file uses the cuda marker" >&2
    exit 2
fi
STATUS=2
if [ -z "${NO_GPU:-}" ]; then
    echo "gpu-check: ${FILES[*]} -> $DIR"
    timeout --kill-after=20 "$BUDGET_S" "$PYTHON" -m pytest -m cuda -p no:cacheprovider -q -rs \
        --junitxml="$DIR/gpu-check-junit.xml" "${FILES[@]}" 2>&1 | tee "$DIR/gpu-check.log"
    STATUS=${PIPESTATUS[0]}

    # ===== CUDA benches: CUDA tensors on geryon's flows (docs/gpu.md) ===========================
    # Ranks as local processes over loopback: geryon with CUDA tensors, with the same data as CPU
    # tensors, and gloo with CUDA tensors; the share of copy time hidden. One line per bench in
    # benches.tsv (name, exit status, seconds); its rows in bench-NAME.jsonl.
    : >"$DIR/benches.tsv"
    bench() {   # bench NAME LIMIT_S ARGS...: one `geryon bench` run, bounded
        local name=$1 limit=$2 started rc
        shift 2
        started=$(date +%s)
        timeout --signal=INT --kill-after=10 "$limit" "$PYTHON" -m geryon.cli bench "$@" --json \
            >"$DIR/bench-$name.log" 2>&1
        rc=$?
        grep '^{' "$DIR/bench-$name.log" >"$DIR/bench-$name.jsonl"
        printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - started))" >>"$DIR/benches.tsv"
        echo "gpu-check: bench $name exit $rc in $(($(date +%s) - started)) s"
        [ "$rc" -eq 0 ] || STATUS=1
    }
    bench allreduce-cuda $((BENCH_S * 2 / 3)) allreduce --device cuda --workers 4 --sizes 1e8 --repeat 3
    bench transport-cuda $((BENCH_S / 3)) transport --device cuda --size-mb 25 --iters 3
    # ===== end of CUDA benches ==================================================================
fi

"$PYTHON" - "$DIR" "$STATUS" "$BUDGET_S" ${NO_GPU:+no-gpu} <<'PY'
"""Summarise the junit report and the machine's GPU, PyTorch and NCCL into gpu-check.md/.json."""
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, status, budget = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
no_gpu = len(sys.argv) > 4 and sys.argv[4] == "no-gpu"
machine = {"python": platform.python_version(), "kernel": platform.release(), "status": status}
try:
    import torch
    import torch.distributed as dist

    machine["torch"] = torch.__version__
    machine["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name(0)
        machine["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    machine["nccl_in_torch"] = dist.is_nccl_available()
    if dist.is_nccl_available():
        machine["torch_has_traffic_class"] = hasattr(dist.ProcessGroupNCCL.Options().config, "traffic_class")
except Exception as exc:  # noqa: BLE001 -- the summary reports whatever it could not read
    machine["torch_error"] = repr(exc)
try:
    machine["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                       timeout=10).stdout.strip() or None
except OSError:
    machine["commit"] = None
tests = []
report = out / "gpu-check-junit.xml"
if report.exists():
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome, reason = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind], \
                    (found.get("message") or "").strip()
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 2), "reason": reason[:300]})
elif no_gpu:
    machine["note"] = "no CUDA GPU is visible here (torch.cuda.is_available() is false): nothing was run"
else:
    machine["note"] = f"no junit report: pytest did not finish within {budget} s or did not start"
benches = []
if (out / "benches.tsv").exists():
    for line in (out / "benches.tsv").read_text().splitlines():
        name, rc, seconds = line.split("\t")
        rows = out / f"bench-{name}.jsonl"
        benches.append({"bench": name, "exit": int(rc), "seconds": int(seconds),
                        "rows": [json.loads(r) for r in rows.read_text().splitlines()] if rows.exists() else []})
counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
(out / "gpu-check.json").write_text(json.dumps({"machine": machine, "counts": counts, "tests": tests,
                                               "benches": benches}, indent=1))
lines = ["# geryon GPU check", "", "| | |", "| --- | --- |"]
lines += [f"| {k} | {v} |" for k, v in machine.items()]
lines += ["", "| outcome | count |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in counts.items()]
lines += ["", "| test | outcome | s | reason |", "| --- | --- | --- | --- |"]
lines += [f"| {t['test']} | {t['outcome']} | {t['seconds']} | {t['reason'].replace('|', '/')} |" for t in tests]
for b in benches:
    lines += ["", f"## bench {b['bench']}: exit {b['exit']} in {b['seconds']} s"]
    lines += ["", "```json"] + [json.dumps(row) for row in b["rows"]] + ["```"]
(out / "gpu-check.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit "$STATUS"
