#!/usr/bin/env bash
# nbval over the notebooks whose outputs hold floats, once per CPU kernel set and thread count that changes how
# floats round: the stored outputs must match under every one (kvlab.nb.tolerance says how floats compare).
#   .ci/test-matrix.sh [PYTHON]                 (make test-matrix)
#   NOTEBOOKS="notebooks/03_quantizers.ipynb" .ci/test-matrix.sh    (a subset)
# ATEN_CPU_CAPABILITY forces a torch kernel set without checking the CPU (torch 2.13 runs AVX-512 code on a CPU without
# it and dies of an illegal instruction), so a kernel set this CPU lacks is skipped, and the line says so.
set -u
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-python}}
NOTEBOOKS=${NOTEBOOKS:-"notebooks/02_deepseek_890_bytes.ipynb notebooks/03_quantizers.ipynb notebooks/04_compressed_attention.ipynb notebooks/06_sessions_per_gpu.ipynb notebooks/07_tiering_on_traces.ipynb"}
CONFIGS=("ATEN_CPU_CAPABILITY=default" "ATEN_CPU_CAPABILITY=avx2" "ATEN_CPU_CAPABILITY=avx512"
         "MKL_CBWR=COMPATIBLE" "OMP_NUM_THREADS=1" "OMP_NUM_THREADS=2")
export PYTHONHASHSEED=0
failed=0
summary=()
cpu_has() { [ ! -r /proc/cpuinfo ] || grep -qw "$1" /proc/cpuinfo; }
for cfg in "${CONFIGS[@]}"; do
  need=""
  case "$cfg" in
    ATEN_CPU_CAPABILITY=avx512) need=avx512f ;;
    ATEN_CPU_CAPABILITY=avx2) need=avx2 ;;
  esac
  if [ -n "$need" ] && ! cpu_has "$need"; then
    line="$cfg: skipped, this CPU has no $need (run the matrix on one that has)"
    echo "$line"
    summary+=("$line")
    continue
  fi
  cap=$(env "$cfg" "$PY" -c "import torch; print(torch.backends.cpu.get_cpu_capability())" 2>/dev/null)
  start=$(date +%s)
  out=$(env "$cfg" "$PY" -m pytest -q --nbval-cell-timeout 900 $NOTEBOOKS 2>&1)
  rc=$?
  line="$cfg (torch ran: $cap): $(echo "$out" | tail -n 1) [$(( $(date +%s) - start )) s]"
  echo "$line"
  if [ $rc -ne 0 ]; then
    failed=1
    echo "$out" | grep -E "^(FAILED|ERROR)" | head -n 20
  fi
  summary+=("$line")
done
echo
echo "test matrix:"
printf '  %s\n' "${summary[@]}"
exit $failed
