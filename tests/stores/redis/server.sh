# CI's Redis server, sourced by .ci/run: redis_up says whether it answers,
# redis_start starts it (the stores' servers are found by their test folders' server.sh).
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
redis_start() {
  echo "ci: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
}
