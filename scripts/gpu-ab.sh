#!/usr/bin/env bash
# Paired comparison of two builds of the CUDA benchmark on the GPU machine: runs A and B
# alternately, ROUNDS times each, and prints per row the median ratio to the floor of each build
# and the median of B's time over A's time taken round by round (below 1: B is faster). Run from
# the repo root on the GPU machine; builds nothing.
#
#   scripts/gpu-ab.sh A B [bench flags...]
#
# A and B: two copies of cuda_attention_bench (for example .device/tools/bench_main, staged from
# main, and .device/cuda_attention_bench, staged from a branch: see docs/PERFORMANCE_HISTORY.md,
# "Fifth session"). Bench
# flags default to --suite=fwd-bwd. Environment: ROUNDS (default 2), BENCH_TIMEOUT seconds per run
# (default 240), OUT (a folder for the CSVs and logs; a temporary one otherwise).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  echo "usage: scripts/gpu-ab.sh A B [bench flags...]" >&2
  exit 2
fi
a="$1"
b="$2"
shift 2
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--suite=fwd-bwd)
for bin in "$a" "$b"; do
  [ -x "$bin" ] || { echo "gpu-ab: $bin is not an executable" >&2; exit 2; }
done
rounds="${ROUNDS:-2}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"

. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn cuda_nvrtc cu13 cublas)
export LD_LIBRARY_PATH="${libs#:}:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1

status=0
for ((r = 1; r <= rounds; r++)); do
  for side in A B; do
    bin="$a"
    [ "$side" = B ] && bin="$b"
    echo "== round $r: $side ($bin) =="
    timeout "${BENCH_TIMEOUT:-240}" "$bin" "${flags[@]}" --csv="$out/$side.$r.csv" \
      >"$out/$side.$r.log" 2>&1 || { echo "gpu-ab: $side round $r failed"; tail -5 "$out/$side.$r.log"; status=1; }
  done
done

python3 - "$out" "$rounds" <<'EOF'
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {}  # (side, round) -> {row: record}
for side in "AB":
    for r in range(1, rounds + 1):
        try:
            with open(f"{out}/{side}.{r}.csv") as f:
                runs[side, r] = {x["row"]: x for x in csv.DictReader(f) if not x["error"]}
        except OSError:
            pass
rows = []
for recs in runs.values():
    rows += [name for name in recs if name not in rows]
print("\n| row | A dattn/floor | B dattn/floor | B/A time (paired rounds) | rounds |")
print("|---|---|---|---|---|")
for name in rows:
    ratio = {s: [float(runs[s, r][name]["ratio"]) for r in range(1, rounds + 1)
                 if name in runs.get((s, r), {})] for s in "AB"}
    paired = [float(runs["B", r][name]["dattn_ms"]) / float(runs["A", r][name]["dattn_ms"])
              for r in range(1, rounds + 1)
              if name in runs.get(("A", r), {}) and name in runs.get(("B", r), {})]
    med = lambda v: f"{statistics.median(v):.3f}" if v else "-"
    print(f"| {name} | {med(ratio['A'])} | {med(ratio['B'])} | {med(paired)} | {len(paired)} |")
EOF
exit $status
