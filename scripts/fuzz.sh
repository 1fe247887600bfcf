#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (.bazelrc's --config=fuzz: clang 14, libFuzzer, Address,
# Leak and UndefinedBehaviorSanitizer) and runs each for a while, several at once; docs/FUZZING.md.
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--out DIR] [--no-build] [--bin DIR]
#                   [--workers TARGET=N,...] [TARGET...]
#   scripts/fuzz.sh --stage DIR        build the targets and copy them, with the shared libraries
#                                      they load that a bare machine may lack, into DIR, and pack
#                                      that into DIR.tar.xz (for a long campaign on another
#                                      machine: unpack it there and run with --bin DIR)
#
#   --seconds N   run time of each target (default 60)
#   --jobs J      targets running at once, one core each (default: the machine's cores)
#   --out DIR     where each target's new inputs, log and any failing input go; DIR/<target>/corpus
#                 grows across runs of one DIR (default: a new folder under $TMPDIR, removed when
#                 every target passed, kept otherwise)
#   --no-build    use the binaries already built
#   --bin DIR     use the binaries in DIR (from --stage; implies --no-build; DIR/lib joins
#                 LD_LIBRARY_PATH)
#   --workers T=N run target T as N processes at once (libFuzzer -jobs=N -workers=N, each for
#                 --seconds, sharing the target's new-input folder; N cores): its executions are
#                 the sum of the N processes'. Default 1. --jobs then counts targets, not cores.
#   TARGET        requests_fuzz, attend_relay_fuzz, inference_fuzz, job_file_fuzz,
#                 safetensors_fuzz, checkpoint_fuzz, model_folder_fuzz, tcp_store_fuzz
#                 (default: all)
# Extra Bazel options (e.g. --local_cpu_resources=1) come from $DATTN_BAZEL_FLAGS, startup options
# (scripts/test.sh's fresh output root) from $DATTN_BAZEL_STARTUP.
#
# Each target starts from its checked-in corpus (fuzz/corpus/<target>/, read only) and its
# dictionary, with -max_len, -rss_limit_mb=2048 (also the largest single allocation) and a 10 s
# per-input timeout. Any crash, leak, sanitizer report, timeout or out-of-memory fails it: the
# input is saved as DIR/<target>/crash-* (leak-*, timeout-*, oom-*) and its path printed.
# Prints one line per target (executions, executions per second, inputs added) and the total.
# Exit status: 0 when every target ran its time without a failure; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

# target  max_len  dictionary (fuzz/dict/, - for none)
TARGETS="
requests_fuzz     4096   -
attend_relay_fuzz 4096   -
inference_fuzz    4096   -
job_file_fuzz     4096   job_file.dict
safetensors_fuzz  8192   safetensors.dict
checkpoint_fuzz   4096   checkpoint.dict
model_folder_fuzz 8192   model_folder.dict
tcp_store_fuzz    4096   -
"

seconds=60
jobs=$(nproc 2>/dev/null || echo 2)
out=""
build=1
bin_dir=""
stage_dir=""
declare -A workers_of=()
selected=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --bin) bin_dir="$2"; build=0; shift 2 ;;
    --stage) stage_dir="$2"; shift 2 ;;
    --workers)
      for pair in ${2//,/ }; do
        workers_of[${pair%%=*}]="${pair#*=}"
      done
      shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {print}' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) selected+=("$1"); shift ;;
  esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ] || ! [[ "$jobs" =~ ^[0-9]+$ ]] ||
  [ "$jobs" -lt 1 ]; then
  echo "fuzz.sh: --seconds and --jobs take positive integers" >&2
  exit 2
fi
all=($(echo "$TARGETS" | awk 'NF {print $1}'))
[ ${#selected[@]} -eq 0 ] && selected=("${all[@]}")
for t in "${selected[@]}"; do
  if ! echo " ${all[*]} " | grep -q " $t "; then
    echo "fuzz.sh: unknown target $t (targets: ${all[*]})" >&2
    exit 2
  fi
done

for t in "${!workers_of[@]}"; do
  if ! echo " ${all[*]} " | grep -q " $t " || ! [[ "${workers_of[$t]}" =~ ^[0-9]+$ ]] ||
    [ "${workers_of[$t]}" -lt 1 ]; then
    echo "fuzz.sh: --workers wants TARGET=N with a known target and N >= 1, got $t=${workers_of[$t]}" >&2
    exit 2
  fi
done

if [ -n "$stage_dir" ]; then
  set -e
  labels=()
  for t in "${all[@]}"; do labels+=("//fuzz:$t"); done
  # shellcheck disable=SC2086
  bazel ${DATTN_BAZEL_STARTUP:-} build --config=fuzz ${DATTN_BAZEL_FLAGS:-} "${labels[@]}" 2>&1 |
    tail -2
  # shellcheck disable=SC2086
  from=$(bazel ${DATTN_BAZEL_STARTUP:-} info --config=fuzz ${DATTN_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)
  rm -rf "$stage_dir"
  mkdir -p "$stage_dir/fuzz" "$stage_dir/lib"
  for t in "${all[@]}"; do
    cp -fL "$from/fuzz/$t" "$stage_dir/fuzz/"
    chmod u+w "$stage_dir/fuzz/$t"
    strip --strip-debug "$stage_dir/fuzz/$t"
    # The shared libraries it loads from Debian's packages beyond libc's own.
    ldd "$from/fuzz/$t" | awk '$3 ~ /^\// {print $3}' |
      grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
      while read -r lib; do cp -fL "$lib" "$stage_dir/lib/"; done
  done
  # And packed (the ASan binaries are large; a device call carries at most 64 MiB).
  tar -cJf "$stage_dir.tar.xz" -C "$(dirname "$stage_dir")" "$(basename "$stage_dir")"
  du -sh "$stage_dir" "$stage_dir.tar.xz"
  exit 0
fi

keep_out=1
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/dattn-fuzz.XXXXXX")
  keep_out=0
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ "$build" -eq 1 ]; then
  labels=()
  for t in "${selected[@]}"; do labels+=("//fuzz:$t"); done
  echo "fuzz: building ${selected[*]} (--config=fuzz)"
  # shellcheck disable=SC2086
  if ! bazel ${DATTN_BAZEL_STARTUP:-} build --config=fuzz ${DATTN_BAZEL_FLAGS:-} "${labels[@]}" \
    >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo "fuzz: the build failed (log: $out/build.log)"
    exit 1
  fi
fi
if [ -n "$bin_dir" ]; then
  bin=$(cd "$bin_dir" && pwd)
  [ -d "$bin/lib" ] && export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  # shellcheck disable=SC2086
  bin=$(bazel ${DATTN_BAZEL_STARTUP:-} info --config=fuzz ${DATTN_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)
fi
if [ ! -d "$bin/fuzz" ]; then
  echo "fuzz: no fuzz binaries under '$bin' (build them: drop --no-build)"
  exit 1
fi

# run_one TARGET: runs it for $seconds; writes $out/TARGET/{log,status}.
run_one() {
  local t="$1" max_len dict dir options scratch
  read -r _ max_len dict <<<"$(echo "$TARGETS" | awk -v t="$t" '$1 == t')"
  dir="$out/$t"
  mkdir -p "$dir/corpus"
  options=(-max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 -timeout=10
           -print_final_stats=1 -artifact_prefix="$dir/")
  [ "$dict" != "-" ] && options+=(-dict="$PWD/fuzz/dict/$dict")
  local n="${workers_of[$t]:-1}"
  # With N processes, each writes its log (fuzz-J.log) into the folder they start in.
  mkdir -p "$dir/jobs"
  [ "$n" -gt 1 ] && options+=(-jobs="$n" -workers="$n")
  # Scratch files (checkpoint_fuzz writes a folder per input) on tmpfs where there is one: on a
  # disk, the writes cut its executions per second about ninefold.
  scratch="$dir"
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    scratch=$(mktemp -d "/dev/shm/dattn-fuzz-$t.XXXXXX")
  fi
  # New inputs go to the first folder; the checked-in corpus is only read.
  local seeds="$PWD/fuzz/corpus/$t"
  (cd "$dir/jobs" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    TMPDIR="$scratch" "$bin/fuzz/$t" "${options[@]}" "$dir/corpus" "$seeds" >"$dir/log" 2>&1)
  echo $? >"$dir/status"
  # With N processes, libFuzzer copies each one's log (jobs/fuzz-J.log) into its own output as
  # that process ends: the one log has them all.
  [ "$scratch" != "$dir" ] && rm -rf "$scratch"
}

start=$(date +%s)
echo "fuzz: ${#selected[@]} targets, ${seconds} s each, ${jobs} at a time; output in $out"
running=0
for t in "${selected[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  run_one "$t" &
  running=$((running + 1))
done
wait

failed=0
total=0
printf '%-18s %14s %10s %8s  %s\n' target executions "exec/s" "new" result
for t in "${selected[@]}"; do
  dir="$out/$t"
  status=$(cat "$dir/status" 2>/dev/null || echo 99)
  # Summed over the target's processes (one line each).
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/log" | awk '{s += $2} END {if (NR) print s}')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$dir/log" | awk '{s += $2} END {if (NR) print s}')
  added=$(find "$dir/corpus" -type f | wc -l)
  artifacts=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o \
    -name 'timeout-*' -o -name 'oom-*' -o -name 'slow-unit-*' \) | grep -v slow-unit || true)
  result=ok
  if [ "$status" -ne 0 ] || [ -n "$artifacts" ] ||
    grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' "$dir/log"; then
    result="FAILED (exit $status)"
    failed=$((failed + 1))
  fi
  total=$((total + ${execs:-0}))
  printf '%-18s %14s %10s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$added" "$result"
  if [ "$result" != ok ]; then
    grep -E -m 12 'ERROR:|runtime error:|SUMMARY:|^    #[0-9] |Test unit written' "$dir/log" |
      sed 's/^/    /'
    for a in $artifacts; do
      echo "    failing input: $a (replay: bazel-bin/fuzz/$t $a; docs/FUZZING.md)"
    done
    echo "    log: $dir/log"
  fi
done
echo "fuzz: ${#selected[@]} targets, ${total} executions in $(( $(date +%s) - start )) s, ${failed} failed"
[ "$failed" -eq 0 ] && [ "$keep_out" -eq 0 ] && rm -rf "$out"
[ "$failed" -eq 0 ]
