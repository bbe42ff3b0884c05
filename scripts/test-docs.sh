#!/usr/bin/env bash
# Checks the README's promises with the tool as a user gets it:
# 1. runs the README's first command exactly as written (`cargo run --release ...`,
#    taken from README.md, so the two cannot drift), in a scratch folder;
# 2. installs the tool as the README says (`cargo install --locked --path .`) into a
#    scratch root, with this checkout's target folder: it must reuse step 1's release
#    build (fails if it compiles anything);
# 3. runs the installed `npualloc` on every example of README.md and docs/guides/*.md
#    marked `<!-- check: ... -->`, the bare form of the first command among them, and
#    compares what it prints with what the docs show (scripts/check-docs.py).
# Usage: bash scripts/test-docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
target="${CARGO_TARGET_DIR:-$repo/target}"
scratch="$target/doc-check"
rm -rf "$scratch"
mkdir -p "$scratch"
for d in traces examples python scripts docs; do ln -s "$repo/$d" "$scratch/$d"; done

first=$(python3 scripts/check-docs.py --first-command)
prefix="cargo run --release --bin npualloc -- "
if [ "${first#"$prefix"}" = "$first" ]; then
  echo "test-docs: the README's first command should start with '$prefix': $first" >&2
  exit 1
fi
echo "-- the README's first command, as written: $first --"
# The scratch folder is inside the checkout, so cargo finds the workspace from there.
(cd "$scratch" && bash -c "$first") >"$scratch/first.out"
test -s "$scratch/bert_train.svg" || { echo "test-docs: no bert_train.svg written" >&2; exit 1; }

echo "-- cargo install --locked --path . (must reuse that release build) --"
log=$(cargo install --locked --force --path . --root "$scratch/root" --target-dir "$target" 2>&1) \
  || { echo "$log"; exit 1; }
if grep -q Compiling <<<"$log"; then
  echo "$log"
  echo "test-docs: cargo install compiled again instead of reusing the README command's release build" >&2
  exit 1
fi
echo "installed $scratch/root/bin/npualloc"

# The installed tool prints what `cargo run` printed (the speed line aside).
bare="npualloc ${first#"$prefix"}"
(cd "$scratch" && PATH="$scratch/root/bin:$PATH" bash -c "$bare") >"$scratch/bare.out"
if ! diff <(grep -v 'replay speed' "$scratch/first.out") <(grep -v 'replay speed' "$scratch/bare.out"); then
  echo "test-docs: '$bare' printed something else than '$first'" >&2
  exit 1
fi

echo "-- the docs' checked examples, with the installed npualloc --"
python3 scripts/check-docs.py --bin-dir "$scratch/root/bin" --scratch "$scratch"

echo "-- scripts/results.py (docs/results.md's table regeneration) --"
python3 scripts/test_results.py
