#!/usr/bin/env bash
# Fixture: converts Debian's Fashion-MNIST IDX files into the datasets the e2e tests use.
source "$(dirname "$0")/lib.sh"
src=$(dpkg -L dataset-fashion-mnist | grep 'train-images-idx3-ubyte.gz$' | xargs dirname)
mkdir -p "$DATA"
"$BIN" convert idx --images "$src/train-images-idx3-ubyte.gz" \
  --labels "$src/train-labels-idx1-ubyte.gz" --out "$DATA/train.h5"
"$BIN" convert idx --images "$src/t10k-images-idx3-ubyte.gz" \
  --labels "$src/t10k-labels-idx1-ubyte.gz" --out "$DATA/test.h5"
h5dump -a /num_classes "$DATA/train.h5" | contains '(0): 10' || fail "num_classes attribute"
pass "datasets in $DATA"
