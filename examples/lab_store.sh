#!/usr/bin/env bash
# A lab's tracking store on one machine, to try the pipeline against what labs run: a throwaway PostgreSQL cluster
# and an `mlflow server` on it that keeps the artifacts in an S3 bucket (docs/cluster.md, "A lab's store on one
# machine"; the integration tests start the store with this script, tests/lab_store.py).
#
#   examples/lab_store.sh start DIR s3://BUCKET/PREFIX [S3_ENDPOINT]   # DIR: a new folder the store lives in
#   examples/lab_store.sh stop DIR
#
# Everything listens on 127.0.0.1 only. Ports: $PGPORT (default 54329) and $MLFLOW_PORT (default 5000). S3_ENDPOINT
# (host:port, over HTTP) is an S3-compatible server such as MinIO or moto's; without it the AWS SDK's endpoint. The
# bucket's credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and only the server
# needs them: clients send and fetch artifacts through it. `mlflow` must be on PATH with a PostgreSQL driver
# (psycopg, in the project's dev dependencies) and boto3. PostgreSQL's binaries are found on PATH, else in
# $PG_BIN (default /usr/lib/postgresql/15/bin). Run as root, the cluster runs as the `postgres` user (PostgreSQL
# refuses root), and DIR must be a folder that user can enter.
#
# `start` prints the tracking URI (tracking.uri in params.yaml) once the server answers, and keeps it in
# DIR/tracking_uri (benchmarks.sweep_at_scale --lab-store DIR reads it). `stop` stops the server
# and the cluster by the process ids `start` recorded in DIR, and leaves DIR for you to remove.
set -euo pipefail

PGPORT=${PGPORT:-54329}
MLFLOW_PORT=${MLFLOW_PORT:-5000}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
command -v initdb >/dev/null || PATH="$PG_BIN:$PATH"

usage() { sed -n '6,7p' "$0" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
action=$1 dir=$(realpath -m "$2")

# PostgreSQL refuses to run as root: as root, its commands run as the `postgres` user, who owns the cluster's files.
as_db_user=()
[[ $(id -u) -ne 0 ]] || as_db_user=(runuser -u postgres --)

answers() {  # the server's /health, with curl where there is one, else the Python that runs mlflow
  local url=http://127.0.0.1:$MLFLOW_PORT/health
  if command -v curl >/dev/null; then curl -fsS --max-time 2 "$url" >/dev/null 2>&1; return; fi
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$url" 2>/dev/null
}

wait_gone() {  # wait_gone PID SECONDS: 0 once the process has ended, 1 if it still runs after SECONDS
  local pid=$1 tries=$(($2 * 10))
  while kill -0 "$pid" 2>/dev/null && ((tries-- > 0)); do sleep 0.1; done
  ! kill -0 "$pid" 2>/dev/null
}

start() {
  local destination=$1 endpoint=${2:-}
  mkdir -p "$dir/pgdata"
  chmod 700 "$dir/pgdata"
  # The database password: random, in a file only the cluster's user reads; the server gets it through PGPASSWORD,
  # so it never appears in a command line or in the tracking URI.
  head -c 18 /dev/urandom | base64 | tr -d '+/=\n' >"$dir/pgpass"
  chmod 600 "$dir/pgpass"
  if [[ $(id -u) -eq 0 ]]; then chown postgres: "$dir/pgdata" "$dir/pgpass"; fi

  # 1. A cluster whose superuser is `mlflow`, password authentication only, on 127.0.0.1:$PGPORT (no Unix socket).
  "${as_db_user[@]}" initdb -D "$dir/pgdata" -U mlflow --pwfile="$dir/pgpass" --auth=scram-sha-256 \
    --encoding=UTF8 --no-locale >"$dir/initdb.log"
  "${as_db_user[@]}" pg_ctl -D "$dir/pgdata" -l "$dir/pgdata/postgres.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PGPORT -c unix_socket_directories=''" start >/dev/null
  head -1 "$dir/pgdata/postmaster.pid" >"$dir/postgres.pid"
  PGPASSWORD=$(cat "$dir/pgpass") createdb -h 127.0.0.1 -p "$PGPORT" -U mlflow mlflow

  # 2. The tracking server: runs and metrics in PostgreSQL (psycopg 3: postgresql+psycopg://), artifacts proxied to
  # the bucket; one worker, no job runner process. In its own process group, so `stop` ends it with its worker.
  local server_env=("PGPASSWORD=$(cat "$dir/pgpass")" MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false)
  [[ -z $endpoint ]] || server_env+=("MLFLOW_S3_ENDPOINT_URL=http://$endpoint")
  env "${server_env[@]}" setsid mlflow server \
    --backend-store-uri "postgresql+psycopg://mlflow@127.0.0.1:$PGPORT/mlflow" \
    --artifacts-destination "$destination" --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
    >"$dir/mlflow.log" 2>&1 </dev/null &
  echo $! >"$dir/mlflow.pid"

  # 3. Ready when /health answers (the first start creates MLflow's tables: about 10-20 s).
  local tries=900
  until answers; do
    if ! kill -0 "$(cat "$dir/mlflow.pid")" 2>/dev/null || ((tries-- == 0)); then
      tail -20 "$dir/mlflow.log" >&2
      echo "lab_store.sh: the mlflow server did not start (log: $dir/mlflow.log); '$0 stop $dir' ends the rest" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "http://127.0.0.1:$MLFLOW_PORT" | tee "$dir/tracking_uri"  # also kept in DIR for other tools
}

stop() {
  local pid
  if [[ -f $dir/mlflow.pid ]]; then  # the server and its worker: the process group `start` made
    pid=$(cat "$dir/mlflow.pid")
    kill -TERM -- "-$pid" 2>/dev/null || true
    wait_gone "$pid" 20 || kill -KILL -- "-$pid" 2>/dev/null || true
    wait_gone "$pid" 5
    rm -f "$dir/mlflow.pid"
  fi
  if [[ -f $dir/postgres.pid ]]; then  # SIGINT: PostgreSQL's fast shutdown (ends its sessions, then exits)
    pid=$(cat "$dir/postgres.pid")
    kill -INT "$pid" 2>/dev/null || true
    wait_gone "$pid" 30 || kill -QUIT "$pid" 2>/dev/null || true
    wait_gone "$pid" 5
    rm -f "$dir/postgres.pid"
  fi
}

case $action in
  start) [[ $# -ge 3 ]] || usage; start "$3" "${4:-}" ;;
  stop) stop ;;
  *) usage ;;
esac
