# CI's PostgreSQL server, sourced by .ci/run: postgresql_up says whether it answers,
# postgresql_start starts it, postgresql_prepare sets it up for the suite (the stores' servers
# are found by their test folders' server.sh).
postgresql_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
postgresql_start() {
  echo "ci: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
}
# 8 test workers at once, each with clients, listeners and session connections, reached the
# default 100 connections in one CI run ("too many clients already"): the suite gets 300. Only
# a server that is a cluster of pg_ctlcluster's is restarted; any other is left as it is.
postgresql_prepare() {
  local n dir cluster version name
  n=$(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SHOW max_connections") || return 0
  [ "$n" -ge 300 ] && return 0
  dir=$(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SHOW data_directory") || return 0
  cluster=$(pg_lsclusters -h 2>/dev/null | awk -v d="$dir" '$6 == d {print $1 " " $2}') || true
  if [ -z "$cluster" ]; then
    echo "ci: PostgreSQL max_connections is $n (not a pg_ctlcluster cluster: left as it is)"
    return 0
  fi
  echo "ci: PostgreSQL max_connections $n -> 300 (a restart, before the suite)"
  psql -h 127.0.0.1 -U postgres -d postgres -qc "ALTER SYSTEM SET max_connections = 300" || return 0
  read -r version name <<<"$cluster"
  pg_ctlcluster --skip-systemctl-redirect "$version" "$name" restart ||
    pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start || true
  for _ in $(seq 1 30); do postgresql_up && return 0; sleep 1; done
  echo "ci: PostgreSQL did not come back"
  return 1
}
