#!/usr/bin/env bash
# One device call of the kernel work waiting for a GPU, in priority order, each step skipped once the call's
# budget is short; every result under OUT (pack it into one archive for the trip back).
#
#   bash reports/kernels/next_gpu_run.sh OUT [CALL_S]
#
# 0. every kernel test on the GPU (fp32 and the bf16 real-size ones);
# 1. the engine's GPU tests one at a time (each holds a model's weights, KV and a float64 reference): graph replays equal
#    eager steps bit for bit, and every path in bf16, with `dense_fused` and `cascade_folded` (the fused
#    element-wise kernels and the merge folded into the prefix passes' combine);
# 2. the decode step with and without both (bench/engine_host --after-option fused_elementwise=True fold_merge=True:
#    the 16K burst, B = 64);
# 3. the dense prefix pass at every split count against the split rule's pick (bench/dense_splits);
# 4. the fused element-wise kernels' per-layer saving (bench/layer_elementwise);
# 5. slab prefix passes below M_sat: cascade vs dense with 64/128-row tiles (bench/slab_small_m);
# 6. the dense grid and SDPA as graph replays (kernels_h200 --only dense);
# 7. the extend kernel's tiles, with the start orders at 128 x 128 tiles (bench/extend_tiles).
# Read-only on the GPU: no clock or power setting is changed.
set -u
OUT=${1:?usage: next_gpu_run.sh OUT [CALL_S]}
CALL_S=${2:-540}
source "$(dirname "$0")/../gpu_steps.sh"
gpu_tests
step engine_host 200 python3 -m gpu_backend.bench.engine_host --before current \
  --after-option fused_elementwise=True fold_merge=True \
  --out "$OUT/engine_host" --reps 3 --budget-s 180
step dense_splits 90 python3 -m gpu_backend.bench.dense_splits --out "$OUT/dense_splits"
step layer_elementwise 40 python3 -m gpu_backend.bench.layer_elementwise --out "$OUT/layer_elementwise"
step slab_small_m 60 python3 -m gpu_backend.bench.slab_small_m --out "$OUT/slab_small_m"
step dense_grid 60 python3 -m gpu_backend.bench.kernels_h200 --only dense --budget-s 500 --out "$OUT/kernels"
step extend_tiles 100 python3 -m gpu_backend.bench.extend_tiles --out "$OUT/extend_tiles" \
  --configs 128x128w8s3,64x64w4s2,128x128w8s3:heavy_first,128x128w8s3:blocks_major,128x64w8s3:heavy_first
echo "done in $(( $(date +%s) - start )) s"
