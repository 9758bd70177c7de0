# CI's MariaDB server, sourced by .ci/run: mysql_up says whether it answers,
# mysql_start starts it (the stores' servers are found by their test folders' server.sh).
mysql_up() { mariadb-admin --user=root --host=127.0.0.1 --port=3306 ping >/dev/null 2>&1; }
mysql_start() {
  echo "ci: starting MariaDB"
  # --pidfile: the machine's server, not any mariadbd (a test's private one) that runs
  start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid \
    --exec /usr/sbin/mariadbd || true
}
