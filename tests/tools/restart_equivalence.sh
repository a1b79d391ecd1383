#!/usr/bin/env bash
# partrun --max-restarts with checkpoints: a 2-rank training run whose rank 1 is SIGKILLed
# mid-epoch resumes from its last checkpoint and ends with parameters bit-identical to a run
# that was never interrupted (compared through the example's parameter checksum).
set -euo pipefail
partrun=$1 example=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--epochs 3 --limit-train 1536 --limit-test 256 --batch-size 64)   # 12 steps per epoch

"$partrun" --standalone --nproc-per-node 2 "$example" "${args[@]}" --checkpoint "$work/a" > "$work/a.log" 2>&1 ||
  { cat "$work/a.log"; echo "uninterrupted run failed"; exit 1; }
PARTRAIN_EXAMPLE_KILL_AT_STEP=17 "$partrun" --standalone --nproc-per-node 2 --max-restarts 1 --grace 2 \
  "$example" "${args[@]}" --checkpoint "$work/b" > "$work/b.log" 2>&1 ||
  { cat "$work/b.log"; echo "interrupted run did not recover"; exit 1; }

cat "$work/b.log"
grep -q "injected failure at step 17" "$work/b.log" || { echo "the failure was not injected"; exit 1; }
grep -q "SIGKILL" "$work/b.log" || { echo "the launcher did not report the killed rank"; exit 1; }
grep -q "restarting every rank" "$work/b.log" || { echo "the launcher did not restart"; exit 1; }
grep -q "resumed from" "$work/b.log" || { echo "the restarted run did not resume from the checkpoint"; exit 1; }
a=$(grep -o "final parameter checksum [0-9a-f]*" "$work/a.log")
b=$(grep -o "final parameter checksum [0-9a-f]*" "$work/b.log")
echo "uninterrupted: $a"
echo "interrupted:   $b"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "parameters differ after the restart"; exit 1; }
echo "restart equivalence: OK"
