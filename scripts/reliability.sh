#!/usr/bin/env bash
# The nightly-only reliability jobs: Miri, cargo-fuzz and ThreadSanitizer. (The soak,
# the stable property tests over the fuzz targets' entry points and the C tests under
# ASan + UBSan run in every `bash scripts/test-all.sh`.)
#
# Usage: bash scripts/reliability.sh miri            Miri: core unit tests + manual-mode scenario
#        bash scripts/reliability.sh fuzz [SECONDS]  each fuzz target for SECONDS (default 60)
#        bash scripts/reliability.sh tsan            ThreadSanitizer over the concurrent tests
#        bash scripts/reliability.sh ci              what CI runs: Miri (the scenario, the
#                                                    statistics logs' and streams' tests),
#                                                    and a short fuzz run when cargo-fuzz is
#                                                    installed
# Jobs whose toolchain is missing say so and are skipped (exit 0); a job that runs
# and fails fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."

have_nightly() {
  command -v rustup >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q '^nightly'
}

# Installs nightly with the given components when rustup can (bounded), else says why not.
need_nightly() {
  if ! command -v rustup >/dev/null 2>&1; then
    echo "SKIPPED: no rustup, so no nightly toolchain for $*" >&2
    return 1
  fi
  # An installed nightly only gets the missing components (never an update).
  if have_nightly; then
    timeout 600 rustup +nightly component add "$@" >/dev/null 2>&1 && return 0
  elif timeout 600 rustup toolchain install nightly --profile minimal --component "$@" >/dev/null 2>&1; then
    return 0
  fi
  echo "SKIPPED: could not get nightly with $* (offline?)" >&2
  return 1
}

# Miri over the manual-mode scenario (the whole allocator, its dependencies' unsafe code
# included) and the core's unit tests: with `quick`, those of the exact-statistics logs
# (the core's own unsafe code outside the device loaders, which Miri cannot run) and of
# the stream bookkeeping; without it, every module but the tools' (more than ten minutes
# more under Miri).
miri() {
  need_nightly miri rust-src || return 0
  echo "== Miri: manual-mode allocator scenario (tests/miri.rs) =="
  nice -n 10 cargo +nightly miri test --test miri
  echo "== Miri: core unit tests${1:+ ($1)} =="
  # The tools' tests replay whole traces: hours under Miri. Tests that churn tens of
  # thousands of operations take minutes under Miri; their logic is covered by the
  # others and by the scenario.
  local modules=(allocator::accounting:: stream::)
  [ "${1:-}" = quick ] || modules=(pool:: stream:: stats:: allocator:: snapshot:: config:: summary:: device::)
  nice -n 10 cargo +nightly miri test -p npualloc --lib -- "${modules[@]}" \
    --skip behaves_like_a_hash_map_under_churn
}

fuzz() {
  local secs=${1:-60}
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "SKIPPED: cargo-fuzz is not installed (cargo install cargo-fuzz); the same checks ran as property tests" >&2
    return 0
  fi
  need_nightly rust-src || return 0
  for t in trace_parse snapshot_pickle config_parse c_abi; do
    echo "== fuzz $t for ${secs}s =="
    mkdir -p "fuzz/corpus/$t"
    seeds=()
    [ -d "fuzz/regressions/$t" ] && seeds=("fuzz/regressions/$t")
    dir=fuzz
    [ "$t" = c_abi ] && dir=fuzz/ffi # the C ABI's library is also named npualloc
    log=$(mktemp)
    # One target folder for both fuzz packages: the C ABI's shares 25 of its 29
    # compiled units (libFuzzer, the dependencies) with the other's; apart, CI built
    # them twice (150 s).
    if ! nice -n 10 cargo +nightly fuzz run --fuzz-dir "$dir" --target-dir fuzz/target "$t" "fuzz/corpus/$t" ${seeds[@]+"${seeds[@]}"} -- \
      -max_total_time="$secs" -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1; then
      tail -60 "$log"
      echo "fuzz target $t FAILED (the input is under $dir/artifacts/$t/)" >&2
      return 1
    fi
    grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$log" || true
    rm -f "$log"
  done
}

tsan() {
  need_nightly rust-src || return 0
  echo "== ThreadSanitizer: concurrent tests (threaded simulated device, soak, exact statistics) =="
  RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" TSAN_OPTIONS="halt_on_error=1" \
    NPUALLOC_SOAK_OPS=${NPUALLOC_SOAK_OPS:-200000} nice -n 10 \
    cargo +nightly test -Zbuild-std --target "$(rustc -vV | sed -n 's/^host: //p')" \
    --target-dir target/tsan --test all -- stress:: soak:: lending:: cross_stream:: exact_stats
}

case "${1:-}" in
  miri) miri ;;
  fuzz) fuzz "${2:-60}" ;;
  tsan) tsan ;;
  ci)
    miri quick
    fuzz 30
    ;;
  *)
    echo "usage: bash scripts/reliability.sh miri|fuzz [SECONDS]|tsan|ci" >&2
    exit 2
    ;;
esac
