#!/usr/bin/env bash
# One Ray node of a SLURM job: run by `srun` from examples/slurm/study.sbatch on each node of the allocation.
#
#   ray_node.sh head JOB_DIR      # writes <node address>:<GCS port> to JOB_DIR/head_address, then runs the head
#   ray_node.sh worker JOB_DIR    # joins the head whose address JOB_DIR/head_address holds
#
# The node's address is its SLURM NodeAddr (`scontrol show node`, resolved when it is a name), so Ray advertises the
# address the other nodes reach. Every port is a free one picked on this node when it starts (two jobs sharing a
# node never collide; Ray's fixed defaults 6379, 10001, 52365 would), worker ports are left to the OS. Ray's files
# go to a folder of this job and node under ${RAY_NODE_TMP:-/tmp}, removed when the node stops. The Ray is the
# environment's: `ray` from $PROJECT_VENV/bin (study.sbatch sets it). Token auth: RAY_AUTH_MODE=token and
# RAY_AUTH_TOKEN_PATH come from the batch script, one token file for every node. $RAY_START_ARGS adds options of
# your own (--num-gpus, --object-store-memory, --resources ...). `ray start --block` stops its processes on SIGTERM
# (scancel, the end of the job); the batch script stops this step when `dvc repro` is done.
set -euo pipefail

role=$1 job_dir=$2
node=${SLURMD_NODENAME:?run by srun inside a SLURM job}
python=${PROJECT_VENV:?set by study.sbatch}/bin/python
node_addr=$(scontrol show node "$node" | grep -oP 'NodeAddr=\K\S+')
ip=$(getent ahostsv4 "$node_addr" | awk 'NR == 1 {print $1}')
[[ -n $ip ]] || { echo "ray_node.sh: cannot resolve $node's NodeAddr $node_addr" >&2; exit 1; }
temp=${RAY_NODE_TMP:-/tmp}/ray-${SLURM_CLUSTER_NAME:-slurm}-$SLURM_JOB_ID-$node
mkdir -p "$temp"
trap 'rm -rf "$temp"' EXIT

# Eight free TCP ports on this node's address (bound and released at once: Ray binds them a second later).
read -r -a port < <("$python" -c '
import socket, sys
held = [socket.socket() for _ in range(8)]
for s in held:
    s.bind((sys.argv[1], 0))
print(*(s.getsockname()[1] for s in held))
' "$ip")

common=(
  --node-ip-address="$ip" --num-cpus="${SLURM_CPUS_ON_NODE:-1}" --temp-dir="$temp" --disable-usage-stats --block
  --node-manager-port="${port[0]}" --object-manager-port="${port[1]}" --min-worker-port=0 --max-worker-port=0
  --dashboard-agent-listen-port="${port[2]}" --dashboard-agent-grpc-port="${port[3]}"
  --metrics-export-port="${port[4]}" --runtime-env-agent-port="${port[5]}"
)
read -r -a extra <<<"${RAY_START_ARGS:-}"
# Ray 2.60 marks its node draining when `ray start` gets SIGTERM and waits up to 30 s for that. SLURM signals every
# process of the step at once (a requeue, scancel, the job's end), the GCS included: the drain cannot be sent and
# only delays the stop (measured: 31 s at the end of each job). Off unless you set it.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}
case $role in
  head)
    echo "$ip:${port[6]}" >"$job_dir/head_address.tmp"
    mv "$job_dir/head_address.tmp" "$job_dir/head_address"
    "$PROJECT_VENV/bin/ray" start --head --port="${port[6]}" --ray-client-server-port="${port[7]}" \
      --include-dashboard=false "${common[@]}" "${extra[@]}"
    ;;
  worker)
    "$PROJECT_VENV/bin/ray" start --address="$(cat "$job_dir/head_address")" "${common[@]}" "${extra[@]}"
    ;;
  *) echo "ray_node.sh: head or worker, not $role" >&2; exit 2 ;;
esac
