#!/usr/bin/env bash
# The accelerator check: run it first whenever a GPU is lent (one H100 or H200: under 8 minutes).
# Needs JAX's CUDA build in the environment (pip install -e '.[cuda]'); it installs nothing.
#
#   bash benchmarks/device_check.sh            # JSON lines on stdout and in $OUT/device_check.jsonl
#
# Figures, one JSON line each (every line names the device and the date):
#   - the device (name, memory, driver) and JAX's view of it;
#   - benchmarks/mfu.py --size small: each family's train step in bf16 with cuDNN attention, MFU
#     against the datasheet bf16 peak (bytelm's FLOP convention, docs/architecture.md);
#   - the 1B byte LM (base/byte, one device, a smaller batch): MFU;
#   - attention at T = 8192 (B 1, 16 heads of 128, bf16, causal): cuDNN and XLA, forward and
#     backward, TFLOP/s on the causal half of the scores.
# Targets (issue 49): MFU >= 0.35 for small, >= 0.45 at 1B.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-benchmarks/results}"
mkdir -p "$out_dir"
log="$out_dir/device_check.jsonl"
stamp="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
python=${PYTHON:-python}

emit() {  # one JSON line: stdout and the log
  echo "$1" | tee -a "$log"
}

if ! $python -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 1)" 2>/dev/null; then
  echo "device_check: JAX sees no GPU here (backend: $($python -c 'import jax; print(jax.default_backend())' 2>&1 | tail -1)); install JAX's CUDA build: pip install -e '.[cuda]'" >&2
  exit 2
fi

gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo unknown)"
emit "$($python - "$stamp" "$gpu" <<'EOF'
import json, sys
import jax
d = jax.devices()[0]
print(json.dumps({"figure": "device", "date": sys.argv[1], "nvidia_smi": sys.argv[2], "device_kind": d.device_kind,
                  "devices": jax.device_count(), "jax": jax.__version__}))
EOF
)"

# every family's small preset, bf16 with cuDNN attention (the small presets compute in bf16)
$python benchmarks/mfu.py --size small --steps 10 --set model.attention=cudnn > "$out_dir/.mfu_small.txt"
tail -1 "$out_dir/.mfu_small.txt" | $python -c "
import json, sys
r = json.loads(sys.stdin.read())
for family, f in r['families'].items():
    print(json.dumps({'figure': 'mfu_small', 'date': '$stamp', 'device_kind': r['device'], 'family': family, **f}))
" | while read -r line; do emit "$line"; done

# the 1B byte LM on one device (its preset's global batch does not fit one GPU: 8 sequences of 4096)
$python benchmarks/mfu.py --size base --families byte --batch 8 --steps 5 > "$out_dir/.mfu_base.txt"
tail -1 "$out_dir/.mfu_base.txt" | $python -c "
import json, sys
r = json.loads(sys.stdin.read())
for family, f in r['families'].items():
    print(json.dumps({'figure': 'mfu_1b', 'date': '$stamp', 'device_kind': r['device'], 'family': family, **f}))
" | while read -r line; do emit "$line"; done

# attention at T = 8192
$python - "$stamp" <<'EOF' | while read -r line; do emit "$line"; done
import json, sys, time
import jax, jax.numpy as jnp
from bytelm.models.attention import attend
B, T, H, K = 1, 8192, 16, 128
keys = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, (B, T, H, K), jnp.bfloat16) for kk in keys)
causal_flops = 4 * B * H * T * T * K / 2  # QK^T and PV on the causal half
for impl in ("cudnn", "xla"):
    fwd = jax.jit(lambda q, k, v: attend(q, k, v, causal=True, implementation=impl))
    bwd = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v, causal=True, implementation=impl).astype(jnp.float32)), argnums=(0, 1, 2)))
    for name, fn, flops in (("forward", fwd, causal_flops), ("forward+backward", bwd, 3.5 * causal_flops)):
        jax.block_until_ready(fn(q, k, v))
        t0 = time.perf_counter()
        for _ in range(10):
            out = fn(q, k, v)
        jax.block_until_ready(out)
        s = (time.perf_counter() - t0) / 10
        print(json.dumps({"figure": "attention_t8192", "date": sys.argv[1], "device_kind": jax.devices()[0].device_kind,
                          "implementation": impl, "pass": name, "ms": round(s * 1e3, 3),
                          "tflops_per_s": round(flops / s / 1e12, 1)}))
EOF
echo "device_check: wrote $log" >&2
