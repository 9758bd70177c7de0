# CI's PostgreSQL server, sourced by .ci/run: postgresql_up says whether it answers,
# postgresql_start starts it (the stores' servers are found by their test folders' server.sh).
postgresql_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
postgresql_start() {
  echo "ci: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
}
