#!/usr/bin/env bash
# partrun --spares on two nodes (two agents on this host): each node starts 2 ranks and 1 spare
# of examples/fault_tolerant; rank 1 (node 0) is SIGKILLed at step 20 and the lowest spare, replica
# 4 on node 1, heals into its slot across the nodes. Both agents exit 0, and every slot ends with
# the weights of the same job without the kill.
#   fault_tolerant_two_nodes.sh PARTRUN FAULT_TOLERANT
set -uo pipefail
partrun=$1 program=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export PARTRAIN_JOB_TOKEN=ft-two-nodes

# Runs the job once; its two agents' output in $out/<name>.0 and .1. Fails when an agent does.
job() {
  local name=$1
  shift
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local common=(--nnodes 2 --nproc-per-node 2 --spares 1 --master-port "$port" --rdzv-timeout 30)
  timeout 120 "$partrun" "${common[@]}" --node-rank 1 "$program" "$@" > "$out/$name.1" 2>&1 &
  local pid1=$!
  timeout 120 "$partrun" "${common[@]}" --node-rank 0 "$program" "$@" > "$out/$name.0" 2>&1
  local rc0=$? rc1=0
  wait "$pid1" || rc1=$?
  if [ "$rc0" -ne 0 ] || [ "$rc1" -ne 0 ]; then
    echo "FAIL: $name: node 0 exited $rc0, node 1 exited $rc1"
    echo "--- node 0 ---"; cat "$out/$name.0"; echo "--- node 1 ---"; cat "$out/$name.1"
    exit 1
  fi
}
# The distinct weights printed by the slots of a run (one line if they agree).
weights() { cat "$out/$1.0" "$out/$1.1" | sed -n 's/.*in slot [0-9]: final loss [0-9.]*, weights \([-0-9.e ]*\).*/\1/p' | sort -u; }
slots() { cat "$out/$1.0" "$out/$1.1" | grep -c 'in slot [0-9]: final loss'; }

job clean --lose-rank none
job faulty --lose-rank 1 --at-step 20
cat "$out/faulty.0" "$out/faulty.1"
fail() { echo "FAIL: $*"; exit 1; }
[ "$(slots clean)" -eq 4 ] || fail "the clean run: $(slots clean) slots finished, expected 4"
[ "$(slots faulty)" -eq 4 ] || fail "the faulty run: $(slots faulty) slots finished, expected 4"
[ "$(weights clean | wc -l)" -eq 1 ] || fail "the clean run's slots disagree: $(weights clean)"
[ "$(weights faulty)" = "$(weights clean)" ] || fail "with rank 1 lost the slots ended at '$(weights faulty)', without at '$(weights clean)'"
grep -q 'rank 1 (pid [0-9]*) was killed by signal SIGKILL' "$out/faulty.0" || fail "node 0 did not report rank 1's loss"
grep -q 'replica 4 in slot 1: .*healed into the job' "$out/faulty.1" || fail "replica 4 (node 1) did not heal into slot 1"
grep -q 'the job finished (1 failure(s) absorbed' "$out/faulty.0" || fail "node 0 did not report the absorbed failure"
grep -q 'the job finished (0 failure(s) absorbed' "$out/faulty.1" || fail "node 1 did not report the job's end"
# A node started for another shape is refused at once, naming both (node 0 is then stopped).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 60 "$partrun" --nnodes 2 --nproc-per-node 2 --spares 1 --master-port "$port" --node-rank 0 "$program" > "$out/shape.0" 2>&1 &
pid0=$!
timeout 60 "$partrun" --nnodes 2 --nproc-per-node 2 --spares 2 --master-port "$port" --node-rank 1 "$program" > "$out/shape.1" 2>&1
rc1=$?
kill -TERM "$pid0" 2>/dev/null
wait "$pid0" 2>/dev/null
[ "$rc1" -ne 0 ] || fail "node 1, started with --spares 2 against node 0's --spares 1, exited 0"
grep -q "node 0 runs a fault-tolerant job of 2 node(s) of 2 rank(s) and 1 spare(s), this node (1) was started for 2 node(s) of 2 rank(s) and 2 spare(s)" "$out/shape.1" ||
  fail "node 1 did not name both shapes: $(cat "$out/shape.1")"
echo "ok: two nodes, rank 1 lost, replica 4 healed into its slot across the nodes, weights $(weights clean)"
