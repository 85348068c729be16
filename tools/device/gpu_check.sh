#!/usr/bin/env bash
# The GPU checks of issues #41 and #44 as one bounded script for a lent GPU machine (16 cores,
# one GPU, no network, no Rust toolchain): everything built here, carried there.
#
# Here, once per build (the extension is abi3, so it loads under the machine's Python 3.12):
#   make build
#   strip -o .dev-core.so python/inalab/_core.abi3.so
#   echo '/.whl/' >> .git/info/exclude; echo '/.dev-core.so' >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 highspy==1.15.1
# Then one device `run` with carry [".whl", ".dev-core.so", "python/inalab/libnccl-net-inalab.so"],
# command `bash tools/device/gpu_check.sh`, timeout_s 580. Results land in $OUT (JSON and logs).
#
# Steps, each under its own `timeout` so the whole stays inside one call (about 8 minutes):
#   1. NCCL with inalab's plugin (#44): DDP of ResNet-18 on NCCL, 4 ranks as 4 "nodes" on the GPU,
#      against the same with the plugin and CollNet forced, SwitchML and ATP; the rows say whether
#      NCCL's log showed the plugin loaded and every head joined its job (benchmarks/gpu_ddp.py).
#   2. The hook and the backend on CUDA tensors against gloo (#41 item 7).
#   3. Loopback 4 MiB on 16 cores, 4 and 8 workers, SwitchML and ATP against gloo (#41's targets).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/device}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
cp .dev-core.so python/inalab/_core.abi3.so
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"

step() {  # step NAME SECONDS COMMAND...: runs it bounded, its log in $OUT/NAME.log
  local name=$1 secs=$2; shift 2
  echo "== $name (at most $secs s)"
  timeout -k 10 "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $?"; tail -n 25 "$OUT/$name.log"
}

step nccl_collnet 240 python3 benchmarks/gpu_ddp.py --only nccl,collnet:switchml,collnet:atp \
  --out "$OUT/nccl_collnet.json" --json
step ddp_hook_backend 150 python3 benchmarks/gpu_ddp.py --only gloo,hook:switchml,backend:switchml \
  --out "$OUT/ddp_hook_backend.json" --json
step loopback 120 python3 benchmarks/udp_allreduce.py --workers 4,8 --schemes switchml,atp --reps 2 --json \
  --out "$OUT/loopback.json"
