#!/usr/bin/env bash
# Two partrun agents in two network namespaces joined by a veth pair (distinct addresses), so
# the store's and Gloo's traffic really crosses an interface. Exit 77 (skipped) where network
# namespaces cannot be made.
set -uo pipefail
partrun=$1 probe=$2
a=pt$$a b=pt$$b
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b" 2>/dev/null; then
  echo "skipped: cannot create network namespaces here (needs root / CAP_NET_ADMIN)"
  exit 77
fi
set -e
ip link add "v$a" type veth peer name "v$b"
ip link set "v$a" netns "$a"
ip link set "v$b" netns "$b"
ip -n "$a" addr add 10.231.77.1/24 dev "v$a"
ip -n "$b" addr add 10.231.77.2/24 dev "v$b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "v$a" up
ip -n "$b" link set "v$b" up

out=$(mktemp -d)
export PARTRAIN_JOB_TOKEN=ns-test-token PARTRAIN_TIMEOUT_MS=20000
ip netns exec "$b" env PARTRAIN_GLOO_IFNAME="v$b" timeout 60 "$partrun" --nnodes 2 --node-rank 1 \
  --nproc-per-node 1 --master-addr 10.231.77.1 --master-port 29555 --rdzv-timeout 30 "$probe" > "$out/b.log" 2>&1 &
pid_b=$!
ip netns exec "$a" env PARTRAIN_GLOO_IFNAME="v$a" timeout 60 "$partrun" --nnodes 2 --node-rank 0 \
  --nproc-per-node 1 --master-addr 10.231.77.1 --master-port 29555 --rdzv-timeout 30 "$probe" > "$out/a.log" 2>&1
rc_a=$?
wait $pid_b
rc_b=$?
set +e
cat "$out/a.log" "$out/b.log"
rm -rf "$out"
[ $rc_a -eq 0 ] && [ $rc_b -eq 0 ] || { echo "agents failed: $rc_a $rc_b"; exit 1; }
echo "two namespaces: OK"
