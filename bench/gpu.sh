#!/usr/bin/env bash
# `make bench-gpu`: every GPU benchmark the book quotes, in one go, on one CUDA device.
#
#   BENCH_PARTS   comma list of tests, profile, ridge, engine, stream, loop, budget, library, e2e (default:
#                 all but loop, budget and library), or quick (tests, loop, library: about 6 minutes on an H100)
#   BENCH_OUT     folder for the JSON results (default: bench/results)
#   PY            the Python to run (default: .venv/bin/python if present, else python3)
#
# tests   tests/test_engine_cuda.py: CUDA-graph decoding and the stream's graph slots against the
#         dynamic loop and generate (about 30 s)
# profile profile_decode.py: one decoding step of synclib's engine (dynamic cache, and the
#         CUDA-graph step), a bare forward loop and transformers generate, per attention
#         backend (about 4 minutes)
# ridge   bench_ridge.py --paper-scale: 6,500 x 32 x 32 x 4096 grids, 3 split seeds, float32 /
#         TF32 / bf16 against the per-pair solve (about 3 minutes on an H100)
# engine  bench_simulate.py: a Mistral-7B-shaped model in bf16, synclib's engine with the
#         dynamic decoding loop and with CUDA-graph steps (the default on CUDA), and the
#         dialog loop in both modes, 16 tasks (about 6 minutes)
# stream  bench_scheduling.py: the dialog loop turn by turn against continuous batching
#         (simulate.scheduling), a Mistral-7B-shaped model, 32 tasks, replies up to 300 tokens
# loop    bench_scheduling.py, continuous only: the dialog loop at 32 tasks x 2 seeds (128 dialogs
#         in flight with the ToM view), the paper's 300-token limit, with the wall time per part
#         (decoding steps, joins, passive reader, ToM read-outs, cube) and every engine counter
# budget  bench_scheduling.py, continuous only, 64 tasks x 2 seeds: the streams' rows in flight set
#         by a key/value token budget (simulate.kv_tokens, 160k tokens: about 20 GiB at the 7B shape;
#         the slots pad each row to the longest, so they hold more) instead of a count (up to 256
#         dialogs of two parts; the slots are allocated for the rows in flight)
# library bench_library.py: synclib's stream against transformers' generate_batch (continuous
#         batching, paged cache) on 128 opening prompts, plus the states read by our prefill
# e2e     bench_e2e.py --book: `synclib run` on two 7B-shaped models in both orders, 24 tasks,
#         the paper's limits, passive and ToM passes, analyses, notebooks and book
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}
OUT=${BENCH_OUT:-bench/results}
PARTS=,${BENCH_PARTS:-tests,profile,ridge,engine,stream,e2e},
[[ $PARTS == ,quick, ]] && PARTS=,tests,loop,library,
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
"$PY" -c "import torch; assert torch.cuda.is_available(), 'bench-gpu needs a CUDA device'; print(torch.cuda.get_device_name())" || exit 2
status=0
run() { echo "== $(date +%T) $*"; "$@" || { echo "== FAILED ($?): $*"; status=1; }; }
[[ $PARTS == *,tests,* ]] && run "$PY" -m pytest -q -p no:cacheprovider tests/test_engine_cuda.py
[[ $PARTS == *,profile,* ]] && run "$PY" bench/profile_decode.py --device cuda --backends default,no-cudnn \
    --torch-profile --out "$OUT/profile_decode_cuda.json"
[[ $PARTS == *,ridge,* ]] && run "$PY" bench/bench_ridge.py --paper-scale --device cuda --out "$OUT/ridge_paper_cuda.json"
[[ $PARTS == *,engine,* ]] && run "$PY" bench/bench_simulate.py --device cuda --dtype bfloat16 \
    --batch-sizes 1,16,64,128,256 --hf-batch-sizes "" --decode-modes dynamic,auto --sim-episodes 16 \
    --sim-seeds 0 --no-cube --out "$OUT/simulate_cuda_mistral7b.json"
[[ $PARTS == *,stream,* ]] && run "$PY" bench/bench_scheduling.py --device cuda --presets mistral7b \
    --tasks 32 --batch-size 64 --max-new-tokens 300 --newline-every 64 --no-half-batch --out "$OUT/scheduling_cuda.json"
[[ $PARTS == *,loop,* ]] && run "$PY" bench/bench_scheduling.py --device cuda --presets mistral7b \
    --tasks 32 --seeds 2 --batch-size 64 --max-new-tokens 300 --newline-every 64 --modes continuous \
    --no-half-batch --sync-timing --out "$OUT/loop_cuda_mistral7b.json"
[[ $PARTS == *,budget,* ]] && run "$PY" bench/bench_scheduling.py --device cuda --presets mistral7b \
    --tasks 64 --seeds 2 --batch-size 64 --max-new-tokens 300 --newline-every 64 --modes continuous \
    --kv-tokens 160000 --no-half-batch --sync-timing --out "$OUT/loop_budget_cuda_mistral7b.json"
[[ $PARTS == *,library,* ]] && run "$PY" bench/bench_library.py --device cuda --out "$OUT/library_cuda.json"
[[ $PARTS == *,e2e,* ]] && run "$PY" bench/bench_e2e.py --device cuda --book --out "$OUT/e2e_cuda_mistral7b.json"
echo "== $(date +%T) done"
exit $status
