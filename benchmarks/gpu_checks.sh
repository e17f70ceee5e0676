#!/usr/bin/env bash
# The GPU checks as one prepared run for a GPU node (~15 min in all):
#
#   bash benchmarks/gpu_checks.sh      (with the built wheel `.whl` and `.cache/eagle3-home` copied to the node)
#
# (.cache/eagle3-home holds the tiny world the tests build once, ~63 s here: carried, the tests reuse it.)
#
# 1. the `gpu` tests: CUDA batches equal the CPU consumer's for every encoding, staged pinned and copied on a stream
#    the consumer waits for, capture on one GPU and spread by device_map equals the CPU's, training places the
#    target head on the GPU once;
# 2. the loader on CUDA at a large H, raw + zstd (the tiny recipe's) and fp8_topk + lz4 (the large recipes'), with
#    a draft-sized step: the acceptance's <= 1.05 where it is meant;
# 3. the capture overhead on CUDA in bf16 (>= 0.90);
# 4. the capture writer alone at Kimi-K2.5's H (fp8_topk + lz4) on the node's CPU and disk: what bounds a GPU capture;
# 5. on a node that has SGLang 0.5.23 (`pip install 'eagle3-pipeline[sglang]'`, or EAGLE3_SGLANG_PYTHON naming its
#    interpreter; skipped otherwise): capture.backend=sglang against hf on CUDA in bf16, rows/s and the largest
#    difference of the stored features, at tp 1 and, with 8 GPUs, at tp 8 with fp8_topk (the ranks' merged top-k);
#    with KIMI_MODEL_DIR (GLM5_MODEL_DIR) a local checkpoint, the recipe's own capture at tp 8: load time, rows/s and
#    its memory plan next to what each GPU holds while the workers are up.
#
# The node has torch (CUDA), transformers, accelerate and pyarrow but not pydantic: its wheels travel in .whl,
# fetched here once with (Python 3.12 there):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
# Each step has its own time limit and writes $OUT/<step>.log; a failed step does not stop the next.
# GPU_CHECKS_QUICK=1 runs every step at the smallest sizes (a smoke run, on CPU too: the gpu tests then skip).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ! $PY -c "import pydantic" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "pydantic is missing and .whl/ does not install it (see the download command above)"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=".:benchmarks:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
DEVICE=cuda
if [[ -n "${GPU_CHECKS_QUICK:-}" ]]; then
    SIZE_LOADER=(--quick) SIZE_CAPTURE=(--quick) SIZE_WRITER=(--hidden 512 --batches 2 --rounds 1)
    $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || DEVICE=cpu
else
    # H 4096 (Llama-3.1-8B's): a batch of 4 x ~576 tokens is ~300 MB of raw features and the draft-like step
    # ~0.4 GFLOP per token, so the loader has to keep up with a step of realistic size.
    SIZE_LOADER=(--hidden 4096 --rows 96 --rounds 3) SIZE_CAPTURE=(--hidden 1024 --layers 12 --samples 128 --rounds 3)
    SIZE_WRITER=(--rounds 2)  # ~70 s here at 3 rounds, most of it building 1.4 GB of random states
fi

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T)): $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? ($(date +%T))"
    tail -n 30 "$OUT/$name.log"
}

{ nvidia-smi || true; $PY -c "import torch, transformers, pyarrow; print(torch.__version__, transformers.__version__,
pyarrow.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"; nproc; } >"$OUT/node.txt" 2>&1
cat "$OUT/node.txt"
step gpu-tests 165 $PY -m pytest -q -m gpu -p no:cacheprovider tests/unit/train/test_loader.py \
    tests/unit/runtime/test_transfer.py tests/unit/train/test_train_learning.py tests/unit/capture/test_capture_hf_device_map.py
step loader-raw-zstd 110 $PY benchmarks/loader.py --device "$DEVICE" "${SIZE_LOADER[@]}"
step loader-fp8topk-lz4 110 $PY benchmarks/loader.py --device "$DEVICE" --encoding fp8_topk --codec lz4 \
    "${SIZE_LOADER[@]}"
step capture-bf16 110 $PY benchmarks/capture_overhead.py --device "$DEVICE" --dtype bfloat16 "${SIZE_CAPTURE[@]}"
step capture-writer 60 $PY benchmarks/capture_writer.py "${SIZE_WRITER[@]}"

SGLANG_PY=${EAGLE3_SGLANG_PYTHON:-$PY}
if $SGLANG_PY -c "import sglang" 2>/dev/null; then
    GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
    SIZE_SGLANG=(--hidden 1024 --layers 8 --samples 64 --rounds 3)  # 16 heads, 8 KV heads: tp 8 divides both
    [[ -n "${GPU_CHECKS_QUICK:-}" ]] && SIZE_SGLANG=(--quick --rounds 1)
    step sglang-capture-tp1 400 $PY benchmarks/capture_backends.py --device "$DEVICE" --dtype bfloat16 \
        "${SIZE_SGLANG[@]}"
    if [[ "$GPUS" -ge 8 ]]; then
        step sglang-capture-tp8 600 $PY benchmarks/capture_backends.py --device cuda --dtype bfloat16 --tp 8 \
            --encoding fp8_topk --topk 64 "${SIZE_SGLANG[@]}"
        for recipe in kimi_k2_5 glm_5; do
            dir_var=$([[ $recipe == kimi_k2_5 ]] && echo KIMI_MODEL_DIR || echo GLM5_MODEL_DIR)
            [[ -n "${!dir_var:-}" ]] || continue
            step "sglang-$recipe" 3600 $PY benchmarks/capture_backends.py --recipe "$recipe" \
                --model-path "${!dir_var}" --samples 32 --rounds 1
        done
    fi
else
    echo "== sglang-capture: skipped (no SGLang in $SGLANG_PY: pip install 'eagle3-pipeline[sglang]')"
fi
