#!/usr/bin/env bash
# Hierarchical against flat allreduce across real node boundaries, 2 nodes x 2 ranks, fp32:
# each equals bitwise the same run of 4 ranks on one host (same W and options: the design's
# bitwise rule; the one-host hierarchical run groups ranks 0,1 and 2,3 with
# RINGTRAIN_RANKS_PER_NODE=2, as the two nodes do), and hierarchical differs from flat only
# by summation order (docs/usage.md: --comm may change the order in which gradients are
# added), within 1e-5.
source "$(dirname "$0")/lib.sh"
need_cluster
dir=$(tdir multinode-hier)
train=(--data "$DATA/train.h5" --hidden 64 --batch-size 16 --steps 40 --threads 1 --seed 5
       --log-every 20 --prefetch 0)
for comm in mpi hierarchical; do
  mn_mpirun 2 "$BIN" train "${train[@]}" --comm "$comm" --checkpoint-dir "$dir/nodes-$comm" \
    >"$dir/nodes-$comm.out" 2>&1 || { cat "$dir/nodes-$comm.out"; fail "--comm $comm on 2 nodes x 2 failed"; }
  contains "4 rank(s) on 2 node(s).* comm $comm in fp32" <"$dir/nodes-$comm.out" ||
    fail "--comm $comm: not 4 ranks on 2 nodes: $(grep -m1 'rank(s) on' "$dir/nodes-$comm.out")"
  RINGTRAIN_RANKS_PER_NODE=2 mpi 4 -x RINGTRAIN_RANKS_PER_NODE "$BIN" train "${train[@]}" --comm "$comm" \
    --checkpoint-dir "$dir/host-$comm" >"$dir/host-$comm.out" 2>&1 ||
    { cat "$dir/host-$comm.out"; fail "--comm $comm on 1 host x 4 failed"; }
  contains "4 rank(s) on 2 node(s)" <"$dir/host-$comm.out" || fail "one host: RINGTRAIN_RANKS_PER_NODE=2 not in effect"
  h5diff "$dir/nodes-$comm/ckpt-000000040.h5" "$dir/host-$comm/ckpt-000000040.h5" /params /params ||
    fail "--comm $comm: parameters on 2 nodes x 2 differ from 1 host x 4"
  pass "--comm $comm: 2 nodes x 2 ranks bitwise equal to 1 host x 4 ranks"
done
a=$dir/nodes-mpi/ckpt-000000040.h5
b=$dir/nodes-hierarchical/ckpt-000000040.h5
h5diff -d 1e-5 "$a" "$b" /params /params || fail "hierarchical and flat differ by more than 1e-5"
if h5diff -q "$a" "$b" /params /params; then same="bitwise equal"; else same="within 1e-5, not bitwise"; fi
pass "2 nodes x 2: hierarchical and flat $same"
