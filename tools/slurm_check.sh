#!/usr/bin/env bash
# tools/slurm_check.sh: partrain under a real Slurm, on this machine. Starts a single-node cluster
# (munged, slurmctld, slurmd from Debian's slurm-wlm and munge, its configuration and state in a
# temporary folder, nothing under /etc changed), runs the launches a user would, and stops the
# daemons by their PIDs at the end, whatever happened. Every wait is bounded. Needs root (slurmd
# runs jobs as their user). CI's slurm job runs it on the test job's build.
#
#   tools/slurm_check.sh [--install] BUILD_DIR     BUILD_DIR holds examples/ddp and examples/fashion_mnist
#     --install   apt-get install slurm-wlm and munge first where they are missing
#
# Checks: srun -n 2 over gloo (examples/ddp: one job of 2 ranks, also with WORLD_SIZE exported),
# the Fashion-MNIST example over gloo, srun --mpi=pmix over the mpi backend, the mpi backend
# without --mpi=pmix refused with that advice, and an sbatch script running two steps.
set -uo pipefail
if [ "${1:-}" = --install ]; then
  shift
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    start=$SECONDS
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null ||
      { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; } ||
      { echo "slurm_check: cannot install slurm-wlm and munge" >&2; exit 1; }
    echo "slurm_check: installed slurm-wlm and munge in $((SECONDS - start)) s"
  fi
fi
build=${1:?usage: tools/slurm_check.sh [--install] BUILD_DIR}
build=$(cd "$build" && pwd)
ddp=$build/examples/ddp/ddp
fm=$build/examples/fashion_mnist/fashion_mnist
for exe in "$ddp" "$fm"; do
  [ -x "$exe" ] || { echo "slurm_check: $exe is not built" >&2; exit 1; }
done
for tool in munged slurmctld slurmd srun sbatch sinfo; do
  command -v "$tool" >/dev/null || { echo "slurm_check: $tool not found (run with --install, or apt-get install slurm-wlm munge)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "slurm_check: needs root (slurmd starts the jobs)" >&2; exit 1; }

dir=$(mktemp -d /tmp/partrain-slurm.XXXXXX)
stop() {
  for d in slurmd slurmctld munged; do
    [ -f "$dir/$d.pid" ] && kill "$(cat "$dir/$d.pid")" 2>/dev/null
  done
  sleep 1
  for d in slurmd slurmctld munged; do
    [ -f "$dir/$d.pid" ] && kill -9 "$(cat "$dir/$d.pid")" 2>/dev/null
  done
  rm -rf "$dir"
}
trap stop EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
node=$(hostname -s)
mkdir -p "$dir/state" "$dir/spool"
cat >"$dir/slurm.conf" <<CONF
ClusterName=partrain
SlurmctldHost=$node
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$node CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$dir/slurm.conf
munged --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
  --seed-file="$dir/munge.seed" --force || { echo "slurm_check: munged did not start" >&2; exit 1; }
slurmctld || { echo "slurm_check: slurmctld did not start" >&2; exit 1; }
slurmd || { echo "slurm_check: slurmd did not start" >&2; exit 1; }
for _ in $(seq 60); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.5
done
sinfo -h -o %t 2>/dev/null | grep -q idle || { echo "slurm_check: the node never became idle"; tail "$dir/slurmctld.log" "$dir/slurmd.log"; exit 1; }
echo "slurm_check: cluster up ($(srun --version), node $node)"

failed=0
# expect NAME PATTERN CMD...: CMD exits 0 (non-zero when NAME ends in _refused) and prints PATTERN.
expect() {
  local name=$1 pattern=$2 start=$SECONDS rc
  shift 2
  timeout 180 "$@" >"$dir/$name.log" 2>&1
  rc=$?
  if { [[ $name == *_refused ]] && [ $rc -ne 0 ]; } || { [[ $name != *_refused ]] && [ $rc -eq 0 ]; }; then
    if grep -q -- "$pattern" "$dir/$name.log"; then
      echo "ok    $name ($((SECONDS - start)) s)"
      return
    fi
  fi
  echo "FAIL  $name: exit $rc, or no '$pattern' in its output:"
  tail -n 20 "$dir/$name.log"
  failed=1
}
small=(--limit-train 2000 --limit-test 500 --epochs 1 --log-every 0)
expect srun_gloo_ddp "bit-identical on all 2 ranks" srun -n 2 "$ddp"
expect srun_world_size_exported "bit-identical on all 2 ranks" env WORLD_SIZE=2 srun -n 2 "$ddp"
expect srun_gloo_fashion_mnist "2 rank(s) over gloo" srun -n 2 "$fm" "${small[@]}"
expect srun_pmix_mpi "2 rank(s) over mpi" srun --mpi=pmix -n 2 "$fm" --backend mpi "${small[@]}"
expect srun_mpi_without_pmix_refused "run \`srun --mpi=pmix" srun -n 2 "$fm" --backend mpi "${small[@]}"

cat >"$dir/job.sh" <<JOB
#!/bin/bash
#SBATCH -n 2
#SBATCH -o $dir/sbatch.out
srun "$ddp"
srun --mpi=pmix "$fm" --backend mpi ${small[*]}
JOB
start=$SECONDS
job=$(sbatch --parsable "$dir/job.sh") || { echo "FAIL  sbatch: not submitted"; failed=1; }
if [ -n "${job:-}" ]; then
  for _ in $(seq 360); do
    squeue -h -j "$job" 2>/dev/null | grep -q . || break
    sleep 0.5
  done
  if squeue -h -j "$job" 2>/dev/null | grep -q .; then
    echo "FAIL  sbatch: job $job still queued or running after 180 s"
    scancel "$job"
    failed=1
  elif grep -q "bit-identical on all 2 ranks" "$dir/sbatch.out" && grep -q "2 rank(s) over mpi" "$dir/sbatch.out"; then
    echo "ok    sbatch_two_steps ($((SECONDS - start)) s)"
  else
    echo "FAIL  sbatch_two_steps:"
    tail -n 20 "$dir/sbatch.out" 2>/dev/null
    failed=1
  fi
fi
[ $failed -eq 0 ] && echo "slurm_check: all passed" || echo "slurm_check: FAILED"
exit $failed
