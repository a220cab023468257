#!/bin/bash
# Open MPI's launch agent (plm_ssh_agent) for hosts simulated by network namespaces: called like ssh,
#   netns_agent.sh [-options ...] HOST COMMAND...
# it runs COMMAND (a shell command line, as ssh would) inside HOST's network namespace, in a UTS
# namespace of its own with HOST's hostname. $SIMULATED_HOSTS maps hosts: "ADDR=NETNS=HOSTNAME ...".
set -eu
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options such as -x
host=${1:?netns_agent.sh: no host given}
shift
for entry in ${SIMULATED_HOSTS:-}; do
  IFS='=' read -r addr netns name <<<"$entry"
  if [ "$addr" = "$host" ]; then
    exec ip netns exec "$netns" unshare --uts /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' \
      netns_agent "$name" "$*"
  fi
done
echo "netns_agent.sh: host '$host' is not a simulated host (\$SIMULATED_HOSTS='${SIMULATED_HOSTS:-}')" >&2
exit 255
