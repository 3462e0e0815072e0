#!/bin/bash
# The GPU rows of the speed benchmarks (issue 54, item 5), in one call on a lent GPU machine:
# te-pt-tnp with its defaults on fill_speed's cases (the stack, also at 128 windows a model call,
# DINEOF on the GPU against the host, the million-gap cube1m, then demo and scene150k), then
# profiles, checks and a 2 GB (or 10 GB) cube with the rest.
# Each table joins $OUT/results.tar as soon as it is written, so a call cut short keeps what ran.
#
#   GEONP_COMMIT=$(git rev-parse --short HEAD) bash pipelines/benchmarks/on_gpu.sh SECONDS
#
# (GEONP_COMMIT written into the command from here: the device copy's git metadata named an older
# commit, 476505b-dirty for 3069be5, on 2026-11-28.)
# Expects GEONP_DATA to hold the case files (satellite/modis_lst_brazil_2019-11-01.nc,
# satellite/alboran_sst_avhrr_2017-05.nc, era5/era5_t2m_uk_2019-03_hourly.nc), HadISST reachable
# as geonp.demo finds it, and geonp's dependencies installed (or as wheels in .whl/, installed
# into /tmp/site first when that folder exists: see pipelines/weights/README.md for which).
set -u
t0=$(date +%s)
limit=${1:?seconds of wall clock}
out=${OUT:-gpu-out}; mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# Bytecode once, on every core: the wheels go in with --no-compile, and the GPU profile of
# 2026-11-29 (fill_profile_cuda_scene150k.md) still spent 4.5 s compiling modules in a process
# that came after three others had imported them, so nothing was cached between processes there.
# A normal install compiles at install time; a row here should not carry that cost once per process.
python3 -m compileall -q -j 0 /tmp/site geonp pipelines > /dev/null 2>&1
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, xarray, zarr, dask, netCDF4, geonp; assert torch.cuda.is_available(), 'no CUDA device';
print('torch', torch.__version__, 'xarray', xarray.__version__, 'zarr', zarr.__version__)" || exit 4
left() { echo $(( limit - ($(date +%s) - t0) )); }
# Tables as they are written, in one archive ($OUT brings back eight files at most): results.tar.
# Only tables written by this call (newer than the stamp): a step that failed brings back nothing.
stamp=$(mktemp); kept=()
keep() {
  local f
  for f in "$@"; do
    [ "pipelines/results/$f" -nt "$stamp" ] && [[ " ${kept[*]+"${kept[*]}"} " != *" $f "* ]] && kept+=("$f")
  done
  [ ${#kept[@]} -gt 0 ] && tar -cf "$out/results.tar" -C pipelines/results "${kept[@]}"
}

# First what this commit's GPU rows lack: the multi-date stack (its history's DINEOF now on the
# GPU), the same at 128 windows a model call (the GPU sat mostly idle at 16: 0.3-0.5 GB of 140),
# DINEOF's iterations on the GPU against NumPy's on the host (one hourly month's history fold), then
# the whole million-gap cube with what is left but 60 s (on 2026-12-01 it needed 293 s and was cut
# off after the 223 s it got). With the time left: the single scenes (no DINEOF; rows at 2af7632),
# where the cube's time goes (cProfile of its first 192 hours), the cProfile of the 150k-cell scene,
# the CPU/CUDA agreement of one fill (the CPU side uses geonp's C++ kernels, which the GPU never
# does), and last a 2 GB (or 10 GB) cube. Logs go to one file.
run_case() {  # CASE [SECONDS TO LEAVE FOR WHAT FOLLOWS] [MORE fill_speed ARGUMENTS]
  [ "$(left)" -lt $(( 60 + ${2:-0} )) ] && return
  echo "== fill_speed $1 ${*:3} ($(left) s left)"
  timeout "$(( $(left) - 30 - ${2:-0} ))" python3 -m pipelines.benchmarks.fill_speed --device cuda --models te-pt-tnp \
    --cases "$1" "${@:3}" >> "$log" 2>&1
  echo "exit $?"; grep "^{\"case\": \"$1\"" "$log" | tail -1
  keep fill_speed_cuda.md fill_speed_cuda.json
}
log=$out/on_gpu.log
run_case stack 300
run_case stack 300 --batch-size 128
if [ "$(left)" -gt 300 ]; then
  echo "== dineof_speed era5 block block-device ($(left) s left)"
  timeout 100 python3 -m pipelines.benchmarks.dineof_speed --fields era5_uk_hourly_t2m --paths block block-device \
    --device cuda >> "$log" 2>&1
  echo "exit $?"; keep dineof_speed_cuda.md dineof_speed_cuda.json
fi
run_case cube1m 60
for case in demo scene150k; do run_case "$case"; done
if [ "$(left)" -gt 200 ]; then  # where the million-gap cube's time goes: its first 192 hours
  echo "== profile_fill cube1m --steps 192 ($(left) s left)"
  timeout 150 python3 -m pipelines.experiments.profile_fill --case cube1m --steps 192 --device cuda >> "$log" 2>&1
  echo "exit $?"; keep fill_profile_cuda_cube1m_192steps.md
fi
if [ "$(left)" -gt 150 ]; then
  echo "== profile_fill scene150k ($(left) s left)"
  timeout 120 python3 -m pipelines.experiments.profile_fill --case scene150k --device cuda >> "$log" 2>&1
  echo "exit $?"; keep fill_profile_cuda_scene150k.md
fi
if [ "$(left)" -gt 150 ]; then
  echo "== device_agreement ($(left) s left)"
  timeout 120 python3 -m pipelines.benchmarks.device_agreement >> "$log" 2>&1
  echo "exit $?"; keep device_agreement.md device_agreement.json
fi

# The 10 GB cube: about 120 s to write on one core, then the fill; 2 GB when that will not fit.
size=10; [ "$(left)" -lt 330 ] && size=2
if [ "$(left)" -gt 120 ]; then
  echo "== infill_benchmark --size-gb $size ($(left) s left)"
  timeout "$(( $(left) - 10 ))" python3 -m pipelines.benchmarks.infill_benchmark --size-gb "$size" --device cuda \
    --threads "$(nproc)" --models te-pt-tnp --out "pipelines/results/infill_${size}gb_cuda.md" \
    >> "$log" 2>&1
  echo "exit $?"; tail -5 "$log"
  keep "infill_${size}gb_cuda.md" "infill_${size}gb_cuda.json"
fi
echo "wall $(( $(date +%s) - t0 )) s"
