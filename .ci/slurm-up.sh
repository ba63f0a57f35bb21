#!/usr/bin/env bash
# Start a single-node Slurm on 127.0.0.1 for the dask-jobqueue tests (no systemd needed).
#
#   bash .ci/slurm-up.sh            # install if missing, configure, start, wait until idle
#   DASKRL_SLURM_GPUS=1 bash .ci/slurm-up.sh   # also declare 1 GPU (GRES gpu) on the node
#
# Idempotent: when the node already shows idle/mixed with the same configuration it only says
# so. It installs Debian's slurm-wlm and munge when absent, writes /etc/slurm/slurm.conf from
# the shared template (this host's short name, CPU count and memory), starts munged, slurmctld
# and slurmd, and waits until `sinfo` shows the node idle. Exit 0 with one line saying Slurm is
# up, or non-zero with one line saying why it is not (details in /var/log/slurm/*.log).
#
# DASKRL_SLURM_GPUS (default: the count of `nvidia-smi -L`, else 0) declares that many GPUs as
# GRES `gpu`, so jobs with `--gres=gpu:N` are accepted; on a machine without GPUs they are
# stand-in device nodes (no GPU is bound), enough to test GPU-pool job scripts and scheduling.
# Changing it restarts slurmctld/slurmd (queued and running jobs survive in the state files).
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
template="${DASKRL_SLURM_TEMPLATE:-$here/../../shared/slurm/slurm-localhost.conf}"
[[ -f "$template" ]] || template="/work/shared/slurm/slurm-localhost.conf"
tmp_files=()
trap 'rm -f "${tmp_files[@]}"' EXIT
if [[ ! -f "$template" ]]; then  # no shared checkout: the same template, kept here
  template="$(mktemp)"; tmp_files+=("$template")
  cat >"$template" <<'EOF'
ClusterName=localtest
SlurmctldHost=HOSTNAME(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
NodeName=HOSTNAME NodeAddr=127.0.0.1 CPUs=2 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=HOSTNAME Default=YES MaxTime=INFINITE State=UP
EOF
fi
conf_dir=/etc/slurm
conf="$conf_dir/slurm.conf"
wait_s="${DASKRL_SLURM_WAIT_S:-60}"

fail() { echo "slurm-up: $*" >&2; exit 1; }

# 1. Install slurm-wlm + munge when missing.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null || ! command -v sinfo >/dev/null; then
  command -v apt-get >/dev/null || fail "slurmctld/slurmd/munged not installed and no apt-get"
  [[ $(id -u) -eq 0 ]] || fail "Slurm is not installed and installing it needs root"
  echo "slurm-up: installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; } \
    >/tmp/slurm-up-apt.log 2>&1 \
    || fail "apt-get install slurm-wlm munge failed: see /tmp/slurm-up-apt.log"
fi
if [[ $(id -u) -ne 0 ]]; then
  state="$(sinfo -h -o '%t' 2>/dev/null | head -n1)"
  if [[ "$state" == idle* || "$state" == mix* ]]; then
    echo "slurm-up: Slurm already up: node $state"; exit 0
  fi
  fail "starting munged/slurmctld/slurmd needs root (SlurmUser=root)"
fi

# 2. Write slurm.conf for this host.
host="$(hostname -s)"
cpus="$(nproc)"
mem_mb="$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)"
if detected="$(slurmd -C 2>/dev/null | awk '/^NodeName/ {
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      print v["CPUs"], v["RealMemory"] }')" && [[ -n "$detected" ]]; then
  read -r cpus mem_mb <<<"$detected"
fi
mem_mb=$(( mem_mb * 95 / 100 ))  # leave slack: slurmd drains a node that has less than declared
gpus="${DASKRL_SLURM_GPUS:-}"
if [[ -z "$gpus" ]]; then
  gpus=0
  command -v nvidia-smi >/dev/null && gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
fi
[[ "$gpus" =~ ^[0-9]+$ ]] || fail "DASKRL_SLURM_GPUS must be a whole number, got '$gpus'"

new_conf="$(mktemp)"; gres_conf="$(mktemp)"; tmp_files+=("$new_conf" "$gres_conf")
sed -e "s/HOSTNAME/$host/g" \
    -e "s/CPUs=[0-9]*/CPUs=$cpus/" \
    -e "s/RealMemory=[0-9]*/RealMemory=$mem_mb/" \
    -e '/^#/d' "$template" >"$new_conf"
if (( gpus > 0 )); then
  sed -i -e "s/^\(NodeName=.*\) State=/\1 Gres=gpu:$gpus State=/" "$new_conf"
  echo "GresTypes=gpu" >>"$new_conf"
  if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    for i in $(seq 0 $(( gpus - 1 ))); do echo "NodeName=$host Name=gpu File=/dev/nvidia$i"; done
  else  # no GPU devices: stand-in device nodes (copies of /dev/null), so slurmd counts them
    mkdir -p /var/lib/slurm-fake-gpu
    for i in $(seq 0 $(( gpus - 1 ))); do
      dev=/var/lib/slurm-fake-gpu/gpu$i
      [[ -c "$dev" ]] || { rm -f "$dev"; mknod "$dev" c 1 3; }
      echo "NodeName=$host Name=gpu File=$dev"
    done
  fi >"$gres_conf"
fi
grep -q "^NodeName=$host " "$new_conf" || fail "template $template has no NodeName=HOSTNAME line"

changed=0
mkdir -p "$conf_dir"
if ! cmp -s "$new_conf" "$conf"; then cp "$new_conf" "$conf"; chmod 644 "$conf"; changed=1; fi
if (( gpus > 0 )); then
  cmp -s "$gres_conf" "$conf_dir/gres.conf" || { cp "$gres_conf" "$conf_dir/gres.conf"; changed=1; }
elif [[ -f "$conf_dir/gres.conf" ]]; then
  rm -f "$conf_dir/gres.conf"; changed=1
fi

node_state() { sinfo -h -n "$host" -o '%t' 2>/dev/null | head -n1; }
running() { pgrep -x "$1" >/dev/null; }

# Already up with this configuration: nothing to do.
if (( changed == 0 )) && running slurmctld && running slurmd; then
  state="$(node_state)"
  if [[ "$state" == idle* || "$state" == mix* || "$state" == alloc* ]]; then
    echo "slurm-up: Slurm already up on $host ($cpus CPUs, ${mem_mb} MB, $gpus GPU): node $state"
    exit 0
  fi
fi

# 3. (Re)start the daemons. Restart only the daemons this configuration belongs to, by pid file.
stop_daemon() {  # name pidfile
  local pid
  pid="$(cat "$2" 2>/dev/null || true)"
  if [[ -n "$pid" ]] && [[ "$(cat /proc/"$pid"/comm 2>/dev/null)" == "$1" ]]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
}
if (( changed == 1 )); then
  stop_daemon slurmd /run/slurmd.pid
  stop_daemon slurmctld /run/slurmctld.pid
fi

mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
chown munge:munge /run/munge 2>/dev/null || true
if [[ ! -s /etc/munge/munge.key ]]; then
  if command -v mungekey >/dev/null; then mungekey --create --keyfile /etc/munge/munge.key --force
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
fi
if ! running munged; then
  runuser -u munge -- munged \
    || fail "munged did not start (is /etc/munge/munge.key readable by user munge?)"
fi
munge -n | unmunge >/dev/null 2>&1 || fail "munge does not work: munge -n | unmunge failed"
if ! running slurmctld; then
  slurmctld -f "$conf" || fail "slurmctld did not start: see /var/log/slurm/slurmctld.log"
fi
if ! running slurmd; then
  slurmd -f "$conf" || fail "slurmd did not start: see /var/log/slurm/slurmd.log"
fi

# 4. Wait until the node is idle (a node left DOWN/DRAIN by an earlier run is resumed).
state=""
for _ in $(seq $(( wait_s * 2 ))); do
  state="$(node_state)"
  case "$state" in
    idle*|mix*|alloc*)
      echo "slurm-up: Slurm up on $host ($cpus CPUs, ${mem_mb} MB, $gpus GPU): node $state," \
           "partition $(sinfo -h -o '%P' | head -n1)"
      exit 0 ;;
    down*|drain*|drng*|fail*|inval*)
      scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
reason="$(sinfo -h -n "$host" -o '%E' 2>/dev/null | head -n1)"
fail "node $host is '${state:-unknown}' after ${wait_s}s (reason: ${reason:-none}); see" \
     "/var/log/slurm/slurmctld.log and /var/log/slurm/slurmd.log"
