#!/usr/bin/env bash
# The simulator against every bench paper record in docs/data, after the payload-rate change
# (packet headers counted: an emulated port carries 1448 payload bytes per 1514 it counts).
# Run from the repository root; one file per record, plus the same with the code before (BEFORE=1).
set -euo pipefail
out=docs/data/simval-fifteenth
for f in $(ls docs/data/*/paper.json docs/data/*/*/paper.json); do
    name=$(dirname "${f#docs/data/}" | tr / -)
    nice -n 19 .venv/bin/geryon sim --compare "$f" --json > "$out/$name.jsonl"
done
