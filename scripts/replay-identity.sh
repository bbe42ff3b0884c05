#!/usr/bin/env bash
# Replay every shipped trace and every derived multi-stream case under five settings
# and write the `npualloc replay --json` reports (timing fields stripped) plus the
# peak-time snapshots into one directory, so two builds can be compared byte for byte:
#
#   bash scripts/replay-identity.sh /tmp/before     # on the old commit
#   bash scripts/replay-identity.sh /tmp/after      # on the new one
#   diff -r /tmp/before /tmp/after && echo identical
#
# With --zoo (after OUTDIR) it also replays the zoo (traces/zoo/*.trace, their derived
# cases and snapshot pickles), and every run adds the named presets `pytorch` and
# `torch_npu`, and `--min-capacity` (the smallest device each replay fits on).
#
# Set NPUALLOC_BIN to use an already built binary instead of `cargo build --release`.
set -euo pipefail
out=${1:?usage: replay-identity.sh OUTDIR [--zoo]}
zoo=${2:-}
cd "$(dirname "$0")/.."
if [ -z "${NPUALLOC_BIN:-}" ]; then
    cargo build --release --quiet --bin npualloc
    NPUALLOC_BIN=target/release/npualloc
fi
bin=$NPUALLOC_BIN
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pt="reclaim_before_growth:False,adaptive_segments:False,hot_cache:False,lend_segments:False,lend_blocks:False,adaptive_pages:False"
confs=(--conf "" --conf expandable_segments:True --conf "$pt"
       --conf "$pt,expandable_segments:True" --conf lend_blocks:False)
traces=(traces/*.trace)
pickles=(traces/gpt2_infer.snapshot.pickle)
if [ "$zoo" = --zoo ]; then
    confs+=(--conf pytorch --conf torch_npu --min-capacity)
    traces+=(traces/zoo/*.trace)
    pickles+=(traces/zoo/*.snapshot.pickle)
fi

cases=()
for t in "${traces[@]}"; do
    name=$(basename "$t" .trace)
    for c in comm branch rr4; do
        "$bin" derive "$t" --case "$c" -o "$work/$name-$c.trace" >/dev/null 2>&1
        cases+=("$work/$name-$c.trace")
    done
done

strip() {
    python3 -c '
import json, sys, os
v = json.load(sys.stdin)
for r in v:
    r.pop("seconds", None); r.pop("events_per_sec", None)
    r["trace"] = os.path.basename(r["trace"])
json.dump(v, sys.stdout, indent=1, sort_keys=True)
print()'
}

for t in "${traces[@]}" "${cases[@]}"; do
    name=$(basename "$t" .trace)
    "$bin" replay "$t" "${confs[@]}" --json --quiet --snapshot "$out/$name.snap.json" | strip > "$out/$name.json"
done
for t in "${traces[@]}"; do
    name=$(basename "$t" .trace)
    "$bin" replay "$t" "${confs[@]}" --repeat 4 --json --quiet | strip > "$out/$name.x4.json"
done
for t in "${pickles[@]}"; do
    name=$(basename "$t" .snapshot.pickle)
    "$bin" replay "$t" "${confs[@]}" --json --quiet | strip > "$out/$name.pickle.json"
done
echo "wrote $(ls "$out" | wc -l) files to $out"
