#!/usr/bin/env bash
# A run resumed from a checkpoint equals an uninterrupted run bitwise (fp32 and fp16, 2
# ranks), compared by h5diff, an independent reader; resuming on another number of ranks
# continues the run; --resume FILE and --resume never do what they say.
source "$(dirname "$0")/lib.sh"
dir=$(workdir resume)
for case in "1 fp32" "1 fp16" "2 fp32" "2 fp16"; do
  read -r n prec <<<"$case"
  common=(--data "$DATA/train.h5" --precision "$prec" --batch-size 32 --threads 1 --log-every 1000
          --hidden "128,64" --seed 5)
  mpi "$n" "$BIN" train "${common[@]}" --steps 60 --checkpoint-dir "$dir/full-$n-$prec" >/dev/null
  mpi "$n" "$BIN" train "${common[@]}" --steps 25 --checkpoint-dir "$dir/split-$n-$prec" >/dev/null
  out=$(mpi "$n" "$BIN" train "${common[@]}" --steps 60 --checkpoint-dir "$dir/split-$n-$prec")
  grep -q "resumed from .*ckpt-000000025.h5 at step 25" <<<"$out" || fail "$prec: did not resume at step 25"
  a=$dir/full-$n-$prec/ckpt-000000060.h5
  b=$dir/split-$n-$prec/ckpt-000000060.h5
  for group in /params /optimizer; do
    h5diff "$a" "$b" "$group" "$group" || fail "$prec: $group differs after resume"
  done
  for attr in /loss_scaler /data; do
    h5diff "$a" "$b" "$attr" "$attr" || fail "$prec: $attr differs after resume"
  done
  pass "$n rank(s), $prec: resumed run is bitwise identical to the uninterrupted one"
done

# Another world size: 25 steps on 2 ranks, the rest on 1 rank with the same global batch.
common=(--data "$DATA/train.h5" --global-batch-size 64 --threads 1 --log-every 1000 --hidden 64)
mpi 2 "$BIN" train "${common[@]}" --steps 25 --checkpoint-dir "$dir/resize" >/dev/null
out=$("$BIN" train "${common[@]}" --steps 50 --checkpoint-dir "$dir/resize")
grep -q "saved by 2 ranks" <<<"$out" || fail "1-rank run did not resume the 2-rank checkpoint"
h5dump -a /world_size "$dir/resize/ckpt-000000050.h5" | contains '(0): 1' || fail "world_size"
pass "a 2-rank checkpoint continues on 1 rank"

# --resume FILE picks that file; --resume never starts over.
out=$("$BIN" train "${common[@]}" --steps 30 --checkpoint-dir "$dir/other" \
  --resume "$dir/resize/ckpt-000000025.h5")
grep -q "at step 25" <<<"$out" || fail "--resume FILE"
out=$("$BIN" train "${common[@]}" --steps 5 --checkpoint-dir "$dir/fresh" --resume never)
grep -q resumed <<<"$out" && fail "--resume never resumed"
pass "--resume FILE and --resume never"
