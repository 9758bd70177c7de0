# CI's etcd server, sourced by .ci/run: etcd_up says whether it answers,
# etcd_start starts it (the stores' servers are found by their test folders' server.sh).
etcd_up() { ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:2379 --dial-timeout=2s endpoint health >/dev/null 2>&1; }
etcd_start() {
  echo "ci: starting etcd"
  if ! command -v etcd >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client >/dev/null || true
  fi
  # one node for the contract suite; a short heartbeat lets leases be as short as 1 s (etcd's
  # shortest lease is 1.5 election timeouts' worth of heartbeats, rounded up to seconds)
  mkdir -p /var/tmp/dblock-etcd
  setsid etcd --name dblock --data-dir /var/tmp/dblock-etcd \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster dblock=http://127.0.0.1:2380 --heartbeat-interval 50 --election-timeout 500 \
    >/var/tmp/dblock-etcd.log 2>&1 < /dev/null &
}
