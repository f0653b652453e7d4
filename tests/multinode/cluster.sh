#!/usr/bin/env bash
# Fixture of the multinode tests: `cluster.sh up` makes 2 emulated nodes
# (tools/netns-cluster.sh) and a Slurm with one slurmd on each (slurm/local-cluster.sh
# --netns 2); `cluster.sh down` stops Slurm and removes the nodes (CTest runs it after the
# last multinode test, pass or fail). Skipped, with the reason, where namespaces cannot be
# made.
source "$(dirname "$0")/lib.sh"
case "${1:-}" in
  up)
    skip_unless_netns
    cluster stop >/dev/null 2>&1 || true  # the leftovers of an interrupted earlier run
    "$NETNS" down >/dev/null
    rm -rf "$CLUSTER_DIR"
    # TCP gives up on a vanished peer after about 12 s instead of 15 minutes, so that a
    # job that lost a node ends (faults.sh).
    "$NETNS" up --nodes "$NODES" --tcp-retries 5
    "$NETNS" status
    cluster start
    cluster status
    [[ "$(sinfo -h -N -o '%N %T' | sort | paste -sd' ' -)" == "${P}0 idle ${P}1 idle" ]] ||
      fail "Slurm does not show nodes ${P}0 and ${P}1 idle: $(sinfo -h -N -o '%N %T')"
    pass "$NODES emulated nodes ${P}0, ${P}1 on $SUBNET.0/24 with a slurmd each"
    ;;
  down)
    skip_unless_netns
    cluster stop
    "$NETNS" down
    if "$NETNS" status >/dev/null 2>&1; then fail "nodes of $P still there after down"; fi
    pass "Slurm stopped, emulated nodes removed"
    ;;
  *) fail "usage: cluster.sh up|down" ;;
esac
