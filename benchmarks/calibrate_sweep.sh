#!/usr/bin/env bash
# Calibrate the cost model on this GPU from a short sweep (issue 10); results under $OUT.
#   bash benchmarks/calibrate_sweep.sh [NAME] [SECONDS]      (defaults: h100, 150)
# Writes $OUT/calibrate_NAME.json (device, driver, torch/triton/CUDA versions, samples, held-out
# median rho and top-1 before/after, the fitted constants), $OUT/calibrate_NAME.log (per-shape
# progress) and $OUT/nvidia-smi.csv. The same as running, from the repository root:
#   PYTHONPATH=. python3 -m autoopt calibrate --sweep --seconds 150 --format json > $OUT/calibrate_h100.json
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=${1:-h100}
SECONDS_BUDGET=${2:-150}
OUT=${OUT:?set OUT to the folder for the results}
PY=$(command -v python3 || command -v python)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/nvidia-smi.csv" 2>&1
t0=$SECONDS
"$PY" -m autoopt calibrate --sweep --seconds "$SECONDS_BUDGET" --format json \
    > "$OUT/calibrate_$NAME.json" 2> "$OUT/calibrate_$NAME.log"
rc=$?
echo "== calibrate --sweep rc=$rc in $((SECONDS - t0)) s"
tail -n 20 "$OUT/calibrate_$NAME.log"
[ $rc -eq 0 ] || exit $rc
"$PY" - "$OUT/calibrate_$NAME.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
c, s = d["calibration"], d["samples"]
print(f"{d['device']['name']} (driver {d['device']['driver'] or '?'}), {d['versions']}")
print(f"sweep: {s['evaluated']} configs timed in {s['elapsed_s']} s, {s['samples']} samples over {s['shapes']} shapes; "
      f"fit {c['n_train']} in {c['fit_seconds']} s; held-out {c['n_heldout']}; whole command {d['elapsed_s']} s")
for when in ("before", "after"):
    h = c[f"heldout_{when}"]
    print(f"held-out {when:6s}: median rho {h['median_spearman']:.3f}  geomean top-1 {h['geomean_top1']:.3f}  "
          f"min top-1 {h['min_top1']:.3f}")
print("changed:", {k: (round(v["before"], 4), round(v["after"], 4)) for k, v in c["changed"].items()})
print("saved:", d["saved"] or d["not_saved"])
EOF
