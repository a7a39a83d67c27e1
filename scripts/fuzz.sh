#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang 14, ASan + UBSan), replays every
# committed regression input, then fuzzes each target and prints a table of executions,
# coverage and crashes. Exits non-zero if a target crashed or a regression input fails again.
#
#   scripts/fuzz.sh                          every target, 60 s each
#   scripts/fuzz.sh --seconds 600 tokenizer_json chat_template
#   scripts/fuzz.sh --runs 10000000 safetensors
#   scripts/fuzz.sh --regressions-only       replay fuzz/corpus/ only (seconds)
#
# Options:
#   --seconds N         fuzz each target for N seconds (default 60)
#   --runs N            fuzz each target for N executions instead
#   --slice N           run libFuzzer in slices of at most N seconds (default 120); the corpus
#                       carries over from slice to slice
#   --work DIR          the growing corpora (default build/fuzz/work/<target>)
#   --rss-limit-mb N    libFuzzer's -rss_limit_mb (default 2048)
#   --timeout N         seconds one input may run before it counts as a hang (default 10;
#                       raise it when the fuzzers run niced beside other work)
#   --malloc-limit-mb N libFuzzer's -malloc_limit_mb: one allocation above it is a crash
#                       (default 1024), so that an absurd length must be an error, not an OOM
#   --no-build          use the binaries already in build/fuzz
#   --regressions-only  replay the committed inputs and stop
# Environment: KILN_FUZZ_PAUSE_FILE=path makes the script wait between slices while that file
# exists (a shared machine's "quiet please" flag).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

all_targets=(safetensors safetensors_sharded tensorizer model_config tokenizer_json
             tokenizer_encode chat_template openai_request generate_request)
seconds=60
runs=""
slice=120
work=""
rss_limit_mb=2048
malloc_limit_mb=1024
timeout=10
build=1
regressions_only=0
targets=()
while (($# > 0)); do
  case "$1" in
    --seconds) seconds="$2"; runs=""; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --slice) slice="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --rss-limit-mb) rss_limit_mb="$2"; shift 2 ;;
    --malloc-limit-mb) malloc_limit_mb="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --regressions-only) regressions_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("${1#kiln_fuzz_}"); shift ;;
  esac
done
((${#targets[@]} > 0)) || targets=("${all_targets[@]}")
for target in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $target "* ]] ||
    { echo "fuzz.sh: no target '$target' (targets: ${all_targets[*]})" >&2; exit 2; }
done

build_dir="$root/build/fuzz"
work="${work:-$build_dir/work}"
if ((build)); then
  scripts/setup.sh
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz
fi
# Seeds generated from tests/data (fuzz/corpus/ holds only the committed regression inputs).
seeds="$build_dir/seeds"
/usr/bin/python3 fuzz/make_seeds.py --out "$seeds" >/dev/null

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
command -v llvm-symbolizer-14 >/dev/null &&
  export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14)}"

wait_for_quiet() {
  [[ -n "${KILN_FUZZ_PAUSE_FILE:-}" ]] || return 0
  while [[ -e "$KILN_FUZZ_PAUSE_FILE" ]]; do sleep 15; done
}

failed=0

# 1. Every committed regression input, run once as a plain test.
echo "== regression inputs (fuzz/corpus/<target>/)"
for target in "${targets[@]}"; do
  dir="fuzz/corpus/$target"
  [[ -d "$dir" ]] || continue
  mapfile -t inputs < <(find "$dir" -type f ! -name '.*' | sort)
  ((${#inputs[@]} > 0)) || continue
  wait_for_quiet
  mkdir -p "$build_dir/artifacts/$target"
  if "$build_dir/fuzz/kiln_fuzz_$target" -rss_limit_mb="$rss_limit_mb" \
      -malloc_limit_mb="$malloc_limit_mb" -timeout=30 \
      -artifact_prefix="$build_dir/artifacts/$target/" "${inputs[@]}" \
      >"$build_dir/regressions_$target.log" 2>&1; then
    printf '  %-20s %3d inputs pass\n' "$target" "${#inputs[@]}"
  else
    printf '  %-20s FAILED, see %s\n' "$target" "$build_dir/regressions_$target.log"
    { grep -E 'ERROR|runtime error|Running: ' "$build_dir/regressions_$target.log" || true; } |
      tail -5 | sed 's/^/    /'
    failed=1
  fi
done
if ((regressions_only)); then exit "$failed"; fi

# 2. Fuzzing, in slices; a slice ends at its time, its share of --runs, or a crash.
declare -A execs cov ft crashes rate artifacts
for target in "${targets[@]}"; do
  corpus="$work/$target"
  artifact_dir="$build_dir/artifacts/$target"
  mkdir -p "$corpus" "$artifact_dir"
  dict_args=()
  [[ -f "fuzz/dicts/$target.dict" ]] && dict_args=(-dict="fuzz/dicts/$target.dict")
  seed_dirs=("$seeds/$target")
  [[ -d "fuzz/corpus/$target" ]] && seed_dirs+=("fuzz/corpus/$target")
  total_execs=0; total_seconds=0; target_crashes=0; last_cov="-"; last_ft="-"
  while true; do
    if [[ -n "$runs" ]]; then
      ((total_execs < runs)) || break
      limit=(-runs=$((runs - total_execs)) -max_total_time="$slice")
    else
      ((total_seconds < seconds)) || break
      this_slice=$((seconds - total_seconds < slice ? seconds - total_seconds : slice))
      limit=(-max_total_time="$this_slice")
    fi
    wait_for_quiet
    log="$build_dir/fuzz_$target.log"
    started=$(date +%s)
    status=0
    "$build_dir/fuzz/kiln_fuzz_$target" "${limit[@]}" -print_final_stats=1 \
      -rss_limit_mb="$rss_limit_mb" -malloc_limit_mb="$malloc_limit_mb" -timeout="$timeout" \
      -artifact_prefix="$artifact_dir/" "${dict_args[@]}" "$corpus" "${seed_dirs[@]}" \
      >"$log" 2>&1 || status=$?
    total_seconds=$((total_seconds + $(date +%s) - started))
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    total_execs=$((total_execs + ${n:-0}))
    line=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
    if [[ -n "$line" ]]; then
      last_cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$line")
      last_ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$line")
    fi
    # One line per slice, kept across runs: the slices' logs are overwritten.
    printf '%s execs=%s seconds=%s cov=%s ft=%s status=%s\n' "$(date -u +%FT%TZ)" "${n:-0}" \
      "$(($(date +%s) - started))" "$last_cov" "$last_ft" "$status" >>"$build_dir/fuzz_$target.history"
    # A crash, leak, timeout or OOM writes its input; a slow unit (libFuzzer's note about the
    # slowest input, which a loaded machine makes slow) is not a failure.
    if ((status != 0)) || grep -v '/slow-unit-' "$log" | grep -q 'Test unit written to'; then
      target_crashes=$((target_crashes + 1))
      artifact=$(grep -v '/slow-unit-' "$log" | sed -n 's/.*Test unit written to \(.*\)/\1/p' |
        tail -1)
      artifacts[$target]="${artifacts[$target]:-} ${artifact:-"(none written; see $log)"}"
      cp "$log" "$artifact_dir/crash_$(date +%s).log"
      echo "!! kiln_fuzz_$target crashed: ${artifact:-see $log}" >&2
      # (head may close the pipe early: its status must not stop the script under pipefail)
      { grep -E '^==[0-9]+==ERROR|runtime error|^SUMMARY|^    #[0-9] ' "$log" || true; } |
        head -12 | sed 's/^/   /' >&2 || true
      failed=1
      break  # fix it first: fuzzing on would mostly find the same bug again
    fi
    ((n > 0)) || break  # nothing ran (setup failed): stop rather than loop
  done
  execs[$target]=$total_execs
  cov[$target]=$last_cov
  ft[$target]=$last_ft
  crashes[$target]=$target_crashes
  rate[$target]=$((total_seconds > 0 ? total_execs / total_seconds : 0))
done

echo
printf '%-20s %12s %8s %7s %7s %8s\n' target execs exec/s cov ft crashes
for target in "${targets[@]}"; do
  printf '%-20s %12s %8s %7s %7s %8s\n' "$target" "${execs[$target]}" "${rate[$target]}" \
    "${cov[$target]}" "${ft[$target]}" "${crashes[$target]}"
done
for target in "${targets[@]}"; do
  [[ -n "${artifacts[$target]:-}" ]] && echo "crash input(s) of $target:${artifacts[$target]}"
done
exit "$failed"
