#!/usr/bin/env bash
# `ringtrain doctor` on emulated nodes: (1) 4 ranks on 2 nodes with rank 3 pinned to a core
# that a busy loop holds (and at nice 10 beside it): rank 3, and only rank 3, is marked for
# its GEMM rate and its host written to --bad-hosts; (2) 3 nodes with node 2's link shaped
# by tc to a tenth of the unshaped inter-node bandwidth: the node
# pairs 0-2 and 1-2 are marked, 0-1 is not, node 2 is named the suspect, --bad-hosts holds
# its host and --strict exits 2 (the rate: a tenth of the fastest node pair of an unshaped
# run just before); (3) a rank held back before the link tests ends the job
# within --timeout plus seconds, naming that rank; (4) a rank that fails: one message, exit 2.
source "$(dirname "$0")/lib.sh"
need_cluster
dir=$(tdir multinode-doctor)
busy=()
cleanup() {
  for p in "${busy[@]}"; do kill "$p" 2>/dev/null || true; done
  tc qdisc del dev "${P}h2" root 2>/dev/null || true
  ip netns exec "${P}2" tc qdisc del dev eth0 root 2>/dev/null || true
}
trap cleanup EXIT
common=(--threads 1 --gemm-size 256 --stream-mib 8)

# (1) A rank on a busy core. Ranks 0-2 share core 0; rank 3 gets core 1 with a busy loop.
wrap=$dir/pin.sh
cat >"$wrap" <<'EOF'
#!/usr/bin/env bash
if [[ $OMPI_COMM_WORLD_RANK == 3 ]]; then exec taskset -c 1 nice -n 10 "$@"; fi
exec taskset -c 0 "$@"
EOF
chmod +x "$wrap"
taskset -c 1 bash -c 'while :; do :; done' &
busy+=($!)
start=$(date +%s.%N)
out=$(mn_mpirun 2 "$wrap" "$BIN" doctor "${common[@]}" --message-mib 1 --seconds 0.3 --bad-hosts "$dir/bad-busy" 2>&1) ||
  fail "doctor, 4 ranks with one on a busy core, exited $?: $out"
took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
kill "${busy[@]}"
busy=()
echo "$out"
contains "ringtrain doctor: 4 ranks on 2 nodes" <<<"$out" || fail "no header for 4 ranks on 2 nodes: $out"
grep -qE "^  rank 3 on ${P}1: GEMM .* x the ranks' upper quartile" <<<"$out" ||
  fail "rank 3 (busy core, ${P}1) not marked for its GEMM rate: $out"
if grep -E "^  rank [012] on .*: GEMM" <<<"$out"; then fail "a rank on the shared idle core was marked: $out"; fi
[[ "$(cat "$dir/bad-busy")" == "${P}1" ]] || fail "--bad-hosts holds '$(cat "$dir/bad-busy")', expected ${P}1"
pass "doctor marks rank 3 on the busy core (${P}1) and only it for GEMM; 4 ranks on 2 nodes in ${took} s (mpirun included)"

# (2) A shaped link: node 2's veth at a tenth of the unshaped rate.
NODES=3
"$NETNS" up --nodes 3 --tcp-retries 5 >/dev/null
out=$(mn_mpirun 1 "$BIN" doctor "${common[@]}" --message-mib 8 --seconds 0.3 2>&1) || fail "doctor on 3 unshaped nodes exited $?: $out"
echo "$out"
# The fastest node pair of the unshaped run (the table's lines end in the bandwidth).
bw=$(awk '/^  node [0-9]+ \(.*\) - node [0-9]+ \(.*\) +[0-9.]+!? +[0-9.]+!?$/ { gsub("!", ""); if ($NF > m) m = $NF } END { print m }' <<<"$out")
[[ -n $bw ]] || fail "no node-pair lines: $out"
rate_kbit=$(awk -v b="$bw" 'BEGIN { printf "%d", b * 1e9 * 8 / 10 / 1000 }')
((rate_kbit >= 8000)) || fail "the unshaped link measured $bw GB/s: too slow to shape to a tenth of it"
for dev in "${P}h2" "ip netns exec ${P}2 eth0"; do
  read -r -a cmd <<<"$dev"
  devname=${cmd[-1]}
  unset 'cmd[-1]'
  # A bucket of 1 ms of traffic (64 KiB at least): far below the 8 MiB messages, so that a
  # message never passes in one burst and the measured rate is the shaped one.
  burst=$((rate_kbit * 1000 / 8 / 1000))
  ((burst >= 65536)) || burst=65536
  "${cmd[@]}" tc qdisc replace dev "$devname" root tbf rate "${rate_kbit}kbit" burst "$burst" latency 20ms ||
    fail "tc could not shape $devname"
done
rc=0
out=$(mn_mpirun 1 "$BIN" doctor "${common[@]}" --message-mib 8 --seconds 0.3 --strict --bad-hosts "$dir/bad-link" 2>&1) || rc=$?
echo "$out"
((rc == 2)) || fail "--strict with a shaped node exited $rc, expected 2: $out"
for pair in "0 .* - node 2" "1 .* - node 2"; do
  grep -qE "^  node $pair \(${P}2\) +[0-9.]+!? +[0-9.]+!$" <<<"$out" || fail "pair node $pair not marked for bandwidth: $out"
done
if grep -qE "^  node 0 .* - node 1 \(${P}1\) +[0-9.]+!? +[0-9.]+!$" <<<"$out"; then fail "the unshaped pair 0-1 was marked: $out"; fi
contains "node 2 (${P}2) is in 2 of its 2 node links marked: suspect its network" <<<"$out" ||
  fail "node 2 not named the suspect: $out"
grep -qx "${P}2" "$dir/bad-link" || fail "--bad-hosts does not hold ${P}2: $(cat "$dir/bad-link")"
pass "doctor: node 2's link shaped to ${rate_kbit} kbit/s (a tenth of the fastest unshaped pair, ${bw} GB/s) is marked and node 2 named; --strict exits 2"
cleanup

# (3) A rank that stops answering (held back by the test hook RINGTRAIN_TEST_STALL) ends the
# job, naming it; (4) a rank that fails ends it with one message.
NODES=2
rc=0
start=$(date +%s)
out=$(RINGTRAIN_TEST_STALL=1:0:120 MN_TIMEOUT=100 mn_mpirun 1 -x RINGTRAIN_TEST_STALL "$BIN" doctor \
  "${common[@]}" --message-mib 1 --seconds 0.3 --timeout 5 2>&1) || rc=$?
took=$(($(date +%s) - start))
((rc == 2)) || fail "doctor with rank 1 held back exited $rc after ${took} s, expected 2: $out"
grep -qE "no answer from rank 1 on ${P}1 within 5 s \(the barrier before the link tests\)" <<<"$out" ||
  fail "no message naming rank 1: $out"
[[ $(grep -c "ringtrain: error" <<<"$out") == 1 ]] || fail "not one error message: $out"
pass "rank 1 held back ends doctor in ${took} s (--timeout 5) with: $(grep -m1 -o 'no answer from .*' <<<"$out")"
rc=0
out=$(RINGTRAIN_TEST_FAIL=1:doctor MN_TIMEOUT=100 mn_mpirun 1 -x RINGTRAIN_TEST_FAIL "$BIN" doctor \
  "${common[@]}" --message-mib 1 --seconds 0.3 2>&1) || rc=$?
((rc == 2)) || fail "doctor with rank 1 failing exited $rc, expected 2: $out"
[[ $(grep -c "ringtrain: error: .*injected.*rank 1 on ${P}1" <<<"$out") == 1 ]] || fail "not one message naming rank 1: $out"
pass "rank 1 failing in doctor: exit 2, one message"
