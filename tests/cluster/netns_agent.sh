#!/bin/bash
# Open MPI's launch agent (plm_ssh_agent) for hosts simulated by network namespaces: called like ssh,
#   netns_agent.sh [-x] [-o ServerAliveInterval=N] [-o ServerAliveCountMax=M] ... HOST COMMAND...
# it runs COMMAND (a shell command line, as ssh would) inside HOST's network namespace, in a UTS
# namespace of its own with HOST's hostname. $SIMULATED_HOSTS maps hosts: "ADDR=NETNS=HOSTNAME ...".
#
# Like ssh, it stays on the launching host while COMMAND runs and, with ServerAliveInterval, asks the
# other host every N seconds whether it still answers (a TCP connection attempt to a closed port: a
# refusal is an answer); after ServerAliveCountMax [3] unanswered asks in a row it exits 255, leaving
# COMMAND behind, as ssh does when the network between the hosts is cut. Open MPI takes that exit for the
# loss of its daemon there: the launch settings under test (tools/job_common.sh) rely on it.
set -eu
interval=0 count_max=3
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
  option=$1
  shift
  case $option in
    -o) setting=${1:-}; shift ;;
    -o*) setting=${option#-o} ;;
    *) continue ;;
  esac
  case $setting in
    ServerAliveInterval=*) interval=${setting#*=} ;;
    ServerAliveCountMax=*) count_max=${setting#*=} ;;
  esac
done
host=${1:?netns_agent.sh: no host given}
shift
target=
for entry in ${SIMULATED_HOSTS:-}; do
  IFS='=' read -r addr netns name <<<"$entry"
  if [ "$addr" = "$host" ]; then target="$netns $name"; fi
done
if [ -z "$target" ]; then
  echo "netns_agent.sh: host '$host' is not a simulated host (\$SIMULATED_HOSTS='${SIMULATED_HOSTS:-}')" >&2
  exit 255
fi
read -r netns name <<<"$target"
run=(ip netns exec "$netns" unshare --uts /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' netns_agent
     "$name" "$*")
if [ "$interval" -le 0 ]; then
  exec "${run[@]}"
fi

answers() {  # does $host answer within the interval? ("Connection refused" is an answer)
  local said
  said=$(timeout "$interval" bash -c "exec 3<>/dev/tcp/$host/9" 2>&1) && return 0
  case $said in *refused*) return 0 ;; esac
  return 1
}

"${run[@]}" &
child=$!
missed=0
while kill -0 "$child" 2>/dev/null; do
  started=$SECONDS
  if answers; then missed=0; else missed=$((missed + 1)); fi
  if [ "$missed" -ge "$count_max" ]; then
    echo "Timeout, server $host not responding." >&2  # ssh's words
    exit 255
  fi
  while kill -0 "$child" 2>/dev/null && [ $((SECONDS - started)) -lt "$interval" ]; do sleep 0.5; done
done
status=0
wait "$child" || status=$?
exit "$status"
