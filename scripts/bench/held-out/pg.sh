#!/bin/sh
# A private PostgreSQL cluster (unix socket only, in /var/tmp/gleaner-bench-pg, created and
# filled with `pgbench -i -s 10` on first use) started, loaded with `pgbench -S` (select only)
# by CLIENTS clients for SECONDS, and stopped: the whole server's life inside the command, so
# `gleaner run` manages it. Prints pgbench's report ("latency average = ... ms" is front.py's
# figure). Needs the Debian package postgresql; runs the server as the user postgres.
#     pg.sh CLIENTS SECONDS
set -eu
C=${1:?usage: pg.sh CLIENTS SECONDS}
T=${2:?usage: pg.sh CLIENTS SECONDS}
B=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
D=/var/tmp/gleaner-bench-pg
J=1; [ "$C" -gt 1 ] && J=2
as_pg() { su postgres -s /bin/sh -c "$*"; }
start() { as_pg "$B/pg_ctl -D $D/data -o '-k $D/sock -c listen_addresses= -c shared_buffers=256MB' -l $D/log/pg.log -w start" >/dev/null; }
stop() { as_pg "$B/pg_ctl -D $D/data -m fast -w stop" >/dev/null; }
if [ ! -f "$D/data/PG_VERSION" ]; then
    mkdir -p "$D/sock" "$D/log"
    chown -R postgres "$D"
    as_pg "$B/initdb -D $D/data -A trust" >/dev/null
    start
    as_pg "$B/pgbench -h $D/sock -i -q -s 10 postgres" >/dev/null 2>&1
    stop
fi
start
trap stop EXIT
as_pg "$B/pgbench -h $D/sock -n -S -c $C -j $J -T $T postgres"
