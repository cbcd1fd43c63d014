#!/usr/bin/env bash
# The CUDA path, on a machine with one GPU: the live executor's SPB tests on the GPU, then cost
# tables measured there (jigsaw calibrate --device cuda). Usage: bench/cuda_check.sh OUT_DIR
# Writes OUT_DIR/pytest_cuda.log and OUT_DIR/<model>-bs<N>-cuda.json; compare the measured tables
# with the shipped v100 ones with `python -m bench.table_split OUT_DIR/*-cuda.json` (docs/cost_tables.md
# section 8). MODELS="m:bs ..." measures other models; PYTHON picks the interpreter.
set -uo pipefail
out=${1:?usage: bench/cuda_check.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
$py - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0),
      "nccl", torch.distributed.is_nccl_available())
PY
# 1. executor: every distributed job of tests/executor/test_executor_spb.py on the GPU (TF32 off: the reference is on the CPU)
JIGSAW_TEST_DEVICE=cuda NVIDIA_TF32_OVERRIDE=0 timeout 200 $py -m pytest -q -p no:cacheprovider \
    tests/executor/test_executor_spb.py 2>&1 | tee "$out/pytest_cuda.log"
# 2. cost tables measured on the GPU, at the shipped batch sizes
for mb in ${MODELS:-tiny_cnn:32 resnet18:64 resnet50:32 vgg16:32 bert_base:8 transformer_small:64 lstm_lm:20 recommendation:1024}; do
    m=${mb%%:*}; b=${mb##*:}
    timeout 60 $py -m jigsaw_env.calibrate --model "$m" --batch-size "$b" --device cuda --warmup 5 --repeats 30 \
        --no-progress --out "$out/$m-bs$b-cuda.json" || echo "calibrate $m failed (exit $?)"
done
