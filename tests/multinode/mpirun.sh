#!/usr/bin/env bash
# Open MPI across 2 emulated nodes: mpirun on node 0 starts node 1's daemon through
# tools/netns-rsh (no ssh); allreduce_bench at 2 nodes x 1 and 2 nodes x 2 ranks counts 2
# nodes (MPI's shared-memory groups) and no wrong element; ringrun and ringtrain see 2 nodes on their own (no
# RINGTRAIN_RANKS_PER_NODE); and fp32 training on 2 hosts x 1 rank ends with the same
# parameters as 2 ranks on one host (within 1e-5, h5diff).
source "$(dirname "$0")/lib.sh"
need_cluster
dir=$(tdir multinode-mpirun)

for per in 1 2; do
  mn_mpirun "$per" "$BENCH" -b 4K -e 1M -f 16 -n 3 -w 1 --json >"$dir/bench-$per.json" \
    2>"$dir/bench-$per.err" || { cat "$dir/bench-$per.err"; fail "allreduce_bench on 2 nodes x $per failed"; }
  rows=$(python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))
bad = [r for r in rows if r["wrong"] != 0 or r["ranks"] != int(sys.argv[2]) or r["nodes"] != 2]
print(len(rows) if rows and not bad else "bad: %s" % bad)' "$dir/bench-$per.json" $((2 * per)))
  [[ "$rows" =~ ^[0-9]+$ ]] || fail "allreduce_bench on 2 nodes x $per: $rows"
  pass "allreduce_bench: $((2 * per)) ranks on 2 nodes, $rows rows, no wrong element"
done

# Placement: 2 nodes x 2 ranks, ringrun and ringtrain each see two nodes of two ranks.
mn_mpirun 2 -x RINGTRAIN_VERBOSE=1 "$SRC/launch/ringrun" "$BIN" train --data "$DATA/train.h5" \
  --hidden 32 --batch-size 16 --steps 4 --threads 1 --log-every 2 >"$dir/place.out" 2>&1 ||
  { cat "$dir/place.out"; fail "2 x 2 ranks: training failed"; }
for r in 0 1 2 3; do
  for who in ringrun ringtrain; do
    line=$(placement_line "$who" "$r" "$dir/place.out")
    [[ "$(field "$line" host) $(field "$line" local_rank) $(field "$line" local_size)" == \
      "$P$((r / 2)) $((r % 2)) 2" ]] || fail "rank $r: '$line', expected host $P$((r / 2)), local rank $((r % 2)) of 2"
  done
done
grep -q "4 rank(s) on 2 node(s)" "$dir/place.out" ||
  fail "ringtrain's banner does not count 2 nodes: $(grep -m1 'rank(s) on' "$dir/place.out")"
pass "ringrun and ringtrain: ranks 0,1 on ${P}0 and 2,3 on ${P}1, local ranks 0 and 1 of 2"

# fp32: 2 hosts x 1 rank against 2 ranks on one host.
train=(--data "$DATA/train.h5" --hidden 64 --batch-size 32 --steps 60 --threads 1 --seed 11
       --log-every 20 --prefetch 0)
mn_mpirun 1 "$BIN" train "${train[@]}" --checkpoint-dir "$dir/hosts2" >"$dir/hosts2.out" 2>&1 ||
  { cat "$dir/hosts2.out"; fail "training on 2 hosts failed"; }
mpi 2 "$BIN" train "${train[@]}" --checkpoint-dir "$dir/host1" >"$dir/host1.out" 2>&1 ||
  { cat "$dir/host1.out"; fail "training on 1 host failed"; }
a=$dir/hosts2/ckpt-000000060.h5
b=$dir/host1/ckpt-000000060.h5
h5diff -d 1e-5 "$a" "$b" /params /params || fail "parameters on 2 hosts differ from 1 host by more than 1e-5"
if h5diff -q "$a" "$b" /params /params; then same="bitwise equal"; else same="within 1e-5, not bitwise"; fi
pass "fp32, 60 steps: parameters of 2 hosts x 1 rank and 1 host x 2 ranks $same"
