#!/usr/bin/env bash
# Sharded datasets: `convert idx --shards 4` writes NAME-0000k-of-00004.h5, and training on
# the directory, on a glob, or on the single file gives bitwise identical parameters (one
# global sample index); so do --prefetch 0 and --cache (they change how, not what, is read).
source "$(dirname "$0")/lib.sh"
dir=$(workdir sharded)
src=$(dpkg -L dataset-fashion-mnist | grep 'train-images-idx3-ubyte.gz$' | xargs dirname)
mkdir -p "$dir/shards"
out=$("$BIN" convert idx --images "$src/train-images-idx3-ubyte.gz" \
  --labels "$src/train-labels-idx1-ubyte.gz" --out "$dir/shards/fashion.h5" --shards 4)
grep -q "(4 shards)" <<<"$out" || fail "convert --shards 4: $out"
for k in 0 1 2 3; do
  f=$dir/shards/fashion-0000$k-of-00004.h5
  [[ -f $f ]] || fail "missing shard $f"
  h5dump -H "$f" | contains "( 15000, 1, 28, 28 )" || fail "shard $k shape"
done
pass "4 shards of 15000 samples"

run() {  # run NAME --data SPEC [more options]: 30 steps on 2 ranks into $dir/NAME
  local name=$1
  shift
  mpi 2 "$BIN" train "$@" --steps 30 --batch-size 32 --hidden 64 --threads 1 --seed 3 \
    --checkpoint-dir "$dir/$name" >/dev/null
}
run file --data "$DATA/train.h5"
run dir --data "$dir/shards"
run glob --data "$dir/shards/fashion-*-of-00004.h5"
run sync --data "$dir/shards" --prefetch 0
run cache --data "$DATA/train.h5" --cache
for name in dir glob sync cache; do
  h5diff "$dir/file/ckpt-000000030.h5" "$dir/$name/ckpt-000000030.h5" /params /params \
    || fail "$name: parameters differ from the single-file run"
done
pass "file, directory, glob, --prefetch 0 and --cache train bitwise identically"
