#!/usr/bin/env bash
# partrain under PyTorch's own tools, where PyTorch is installed (ctest reports Skipped where it
# is not; bench/peers/compare.py --venv build/peers-venv installs it, several GB):
#   1. the TCPStore client against a real torch.distributed.TCPStore (test_torch_store "[.torch]");
#   2. torchrun --no-python launching examples/ddp in static, --standalone and c10d mode, and as
#      two nodes; the Fashion-MNIST example; a rank killed mid-epoch restarted by torchrun and
#      resumed from its checkpoint; a failing rank's error in torchrun's summary (error file).
#
#   torch_interop.sh PYTHON TEST_TORCH_STORE DDP FASHION_MNIST
#   torch_interop.sh --record PYTHON TEST_TORCH_STORE      re-records torch_store_exchange.txt
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --record ]; then
  PARTRAIN_TORCH_PYTHON=$2 PARTRAIN_TORCH_RECORD=$here/torch_store_exchange.txt "$3" "[.torch]"
  exit
fi
python=$1 store_test=$2 ddp=$3 fm=$4
if ! "$python" -c 'import torch.distributed.run' >/dev/null 2>&1; then
  echo "skipped: '$python' cannot import torch (bench/peers/compare.py --venv build/peers-venv installs PyTorch)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
torchrun=("$python" -m torch.distributed.run --no-python)
failed=0
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# expect NAME PATTERN CMD...: CMD exits 0 (unless NAME ends in _fails) and its output holds PATTERN.
expect() {
  local name=$1 pattern=$2 start=$SECONDS rc
  shift 2
  timeout 240 "$@" >"$work/$name.log" 2>&1
  rc=$?
  if { [[ $name == *_fails ]] && [ $rc -ne 0 ]; } || { [[ $name != *_fails ]] && [ $rc -eq 0 ]; }; then
    if grep -q -- "$pattern" "$work/$name.log"; then
      echo "ok    $name ($((SECONDS - start)) s)"
      return
    fi
  fi
  echo "FAIL  $name: exit $rc, or no '$pattern' in its output:"
  tail -n 30 "$work/$name.log"
  failed=1
}

expect store_client "All tests passed" env PARTRAIN_TORCH_PYTHON="$python" "$store_test" "[.torch]"
expect torchrun_static "bit-identical on all 2 ranks" "${torchrun[@]}" --nproc-per-node 2 --master-port "$(free_port)" "$ddp"
expect torchrun_standalone "bit-identical on all 2 ranks" "${torchrun[@]}" --nproc-per-node 2 --standalone "$ddp"
expect torchrun_c10d "bit-identical on all 2 ranks" "${torchrun[@]}" --nproc-per-node 2 --rdzv-backend c10d \
  --rdzv-endpoint "127.0.0.1:$(free_port)" --rdzv-id interop "$ddp"
port=$(free_port)
timeout 240 "${torchrun[@]}" --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
  "$ddp" >"$work/node1.log" 2>&1 &
node1=$!
expect torchrun_two_nodes "bit-identical on all 4 ranks" "${torchrun[@]}" --nnodes 2 --node-rank 0 --nproc-per-node 2 \
  --master-addr 127.0.0.1 --master-port "$port" "$ddp"
wait "$node1" || { echo "FAIL  torchrun_two_nodes: node 1 exited $?"; tail -n 20 "$work/node1.log"; failed=1; }
small=(--epochs 2 --limit-train 1536 --limit-test 256 --batch-size 64 --log-every 0)  # 12 steps per epoch
expect torchrun_fashion_mnist "final test_accuracy" "${torchrun[@]}" --nproc-per-node 2 --master-port "$(free_port)" \
  "$fm" "${small[@]}"
expect torchrun_restart "resumed from" env PARTRAIN_EXAMPLE_KILL_AT_STEP=17 "${torchrun[@]}" --nproc-per-node 2 \
  --max-restarts 1 --master-port "$(free_port)" "$fm" "${small[@]}" --checkpoint "$work/ckpt"
grep -q "injected failure at step 17" "$work/torchrun_restart.log" ||
  { echo "FAIL  torchrun_restart: the failure was not injected"; failed=1; }
expect torchrun_error_file_fails "traceback : partrain::data_error: partrain: cannot open IDX file" \
  "${torchrun[@]}" --nproc-per-node 2 --master-port "$(free_port)" "$fm" --data "$work/no-such-dir"
exit $failed
