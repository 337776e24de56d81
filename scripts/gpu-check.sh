#!/usr/bin/env bash
# Run every CUDA/NCCL test of geryon on a machine with one GPU, and summarise the run.
#
#   scripts/gpu-check.sh [OUTDIR]        (default: $OUT if set, else ./gpu-check)
#
# Runs the tests marked `cuda` (pytest -m cuda, in the test files that use the marker) with the
# machine's own python3 and packages, from this checkout (PYTHONPATH), installing nothing. The whole
# run is bounded to 8 minutes. Writes into OUTDIR:
#   gpu-check.md          the summary: machine, PyTorch, NCCL, each test's outcome (and skip reason)
#   gpu-check.json        the same as data
#   gpu-check-junit.xml   pytest's own report
#   gpu-check.log         pytest's output
# Exits with pytest's status (0: every test passed or was skipped with its reason).
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${OUT:-$REPO/gpu-check}}"
PYTHON="${PYTHON:-python3}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"   # pytest's share of the 8 minutes; the rest is start-up and summary
mkdir -p "$DIR"
cd "$REPO" || exit 2
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

mapfile -t FILES < <(grep -l "pytest.mark.cuda" tests/test_*.py)
if [ "${#FILES[@]}" -eq 0 ]; then
    echo "gpu-check: no test file uses the cuda marker" >&2
    exit 2
fi
echo "gpu-check: ${FILES[*]} -> $DIR"
timeout --kill-after=20 "$BUDGET_S" "$PYTHON" -m pytest -m cuda -p no:cacheprovider -q -rs \
    --junitxml="$DIR/gpu-check-junit.xml" "${FILES[@]}" 2>&1 | tee "$DIR/gpu-check.log"
STATUS=${PIPESTATUS[0]}

"$PYTHON" - "$DIR" "$STATUS" "$BUDGET_S" <<'PY'
"""Summarise the junit report and the machine's GPU, PyTorch and NCCL into gpu-check.md/.json."""
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, status, budget = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
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
else:
    machine["note"] = f"no junit report: pytest did not finish within {budget} s or did not start"
counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
(out / "gpu-check.json").write_text(json.dumps({"machine": machine, "counts": counts, "tests": tests}, indent=1))
lines = ["# geryon GPU check", "", "| | |", "| --- | --- |"]
lines += [f"| {k} | {v} |" for k, v in machine.items()]
lines += ["", "| outcome | count |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in counts.items()]
lines += ["", "| test | outcome | s | reason |", "| --- | --- | --- | --- |"]
lines += [f"| {t['test']} | {t['outcome']} | {t['seconds']} | {t['reason'].replace('|', '/')} |" for t in tests]
(out / "gpu-check.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit "$STATUS"
