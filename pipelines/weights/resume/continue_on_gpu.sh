#!/bin/bash
# Continue a resumable training run on a GPU machine for a fixed wall-clock time, then leave its
# state, log and config in $OUT (or ./gpu-out), ready to be copied back over the run folder.
#
#   bash pipelines/weights/resume/continue_on_gpu.sh RUN_FOLDER SECONDS
#
# Expects the data files the run's config names under $GEONP_DATA, and geonp's dependencies
# installed (or as wheels in .whl/, installed into /tmp/site first when that folder exists).
# The run continues in /tmp/run with device cuda and a checkpoint every 50 steps; it is stopped
# (SIGINT) SECONDS after this script starts, fold building included, and keeps its last checkpoint.
# A state written on the GPU resumes on the CPU and back (geonp.train_state).
set -u
t0=$(date +%s)
run=${1:?run folder}; limit=${2:?seconds of wall clock}
out=${OUT:-gpu-out}; mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__)" || exit 4
mkdir -p /tmp/run && cp "$run/state.safetensors" "$run/log.csv" /tmp/run/
sed -e 's#^out_dir: .*#out_dir: /tmp/run#' -e 's#^device: .*#device: cuda#' \
    -e 's#^checkpoint_every: .*#checkpoint_every: 50#' "$run/config.yaml" > /tmp/run/config.yaml
# Copies taken as it goes: what is in $out comes back even if the call is cut short.
( while sleep 20; do cp /tmp/run/state.safetensors /tmp/run/log.csv "$out"/ 2>/dev/null; done ) &
copier=$!
left=$(( limit - ($(date +%s) - t0) ))
echo "training for at most $left s of wall clock (fold building included)"
timeout -s INT "$left" python3 -m geonp train /tmp/run/config.yaml --resume --no-progress > "$out/train.log" 2>&1
echo "train exit $? (124: stopped at the time limit)"
kill "$copier" 2>/dev/null
cp /tmp/run/state.safetensors /tmp/run/log.csv "$out"/
tail -4 /tmp/run/log.csv; echo "wall $(( $(date +%s) - t0 )) s"
