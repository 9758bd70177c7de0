# CI's ZooKeeper server, sourced by .ci/run: zookeeper_up says whether it answers,
# zookeeper_start starts it (the stores' servers are found by their test folders' server.sh).
# ZooKeeper's `srvr` four-letter word (whitelisted by default), over bash's /dev/tcp
zookeeper_up() {
  timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/2181 && printf srvr >&3 && grep -q "^Mode:" <&3' \
    2>/dev/null
}
zookeeper_start() {
  echo "ci: starting ZooKeeper"
  if [ ! -x /usr/share/zookeeper/bin/zkServer.sh ]; then
    apt-get update -qq && apt-get install -y -qq zookeeperd >/dev/null || true
  fi
  # Debian's package would start it through systemd; start it by hand (its /etc/zookeeper/conf)
  setsid /usr/share/zookeeper/bin/zkServer.sh start >/dev/null </dev/null || true
}
