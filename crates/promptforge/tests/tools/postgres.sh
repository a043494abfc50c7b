#!/usr/bin/env bash
# A throwaway PostgreSQL server on 127.0.0.1 for the run-log tests:
#   postgres.sh start        initdb in a new folder under /tmp (one the
#                            `postgres` user can reach), start on a free port,
#                            print the variables the tests read (eval them):
#                            PROMPTFORGE_TEST_POSTGRES_URL (a superuser URL; each
#                            test makes a database of its own) and
#                            PROMPTFORGE_TEST_POSTGRES_DIR (for restart/stop)
#   postgres.sh restart DIR  stop (fast) and start again on the same port
#   postgres.sh stop DIR     stop it and remove DIR
# As root the server runs as the `postgres` user (initdb refuses root).
set -euo pipefail
what="${1:?usage: postgres.sh start | restart DIR | stop DIR}"
if [ "$what" = start ]; then
  dir="$(mktemp -d /tmp/promptforge-postgres.XXXXXX)"
else
  dir="${2:?usage: postgres.sh start | restart DIR | stop DIR}"
fi
bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
[ -x "$bin/pg_ctl" ] || { echo "postgres.sh: PostgreSQL is not installed (setup.sh postgres)" >&2; exit 1; }
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
ctl() { as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 "$@"; }
case "$what" in
  start)
    if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >"$dir/initdb.log" \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    # Only 127.0.0.1; a socket directory of its own; fsync off (a test server).
    echo "$port" >"$dir/port"
    ctl -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null \
      || { cat "$dir/server.log" >&2; exit 1; }
    echo "export PROMPTFORGE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$port/postgres"
    echo "export PROMPTFORGE_TEST_POSTGRES_DIR=$dir"
    ;;
  restart)
    port="$(cat "$dir/port")"
    ctl -m fast stop >/dev/null
    ctl -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null \
      || { cat "$dir/server.log" >&2; exit 1; }
    ;;
  stop)
    if [ -f "$dir/data/postmaster.pid" ]; then ctl -m fast stop >/dev/null || true; fi
    case "$dir" in /tmp/promptforge-postgres.*) rm -rf "$dir" ;; esac
    ;;
  *)
    echo "postgres.sh: unknown action $what" >&2
    exit 2
    ;;
esac
