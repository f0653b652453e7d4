// Test-only fault injection: RINGTRAIN_TEST_FAIL=RANK:POINT[:STEP] makes rank RANK throw a
// runtime error (exit 2) when it reaches POINT (at step STEP, or the first time when no step
// is given). The end-to-end tests use it to prove that an error at any point of the loop, on
// any rank, ends every rank with one message (tests/e2e/failures.sh). Points: read (the
// loader thread), forward, backward, reduce (the communication thread), gather (--zero 1's
// all-gather, the communication thread), paramgather (--zero 3's all-gather of a node's
// parameters, before its forward or backward), optimizer, eval,
// save (between collective writes of a checkpoint), metrics (rank 0's metrics writer),
// export (after `ringtrain export` built and checked the graph), doctor (`ringtrain doctor`,
// before its link tests); and, where a checkpoint save
// meets a write error without throwing (fault_requested), savewrite (this rank's direct chunk
// write), saveflush (the HDF5 flush) and savecommit (rank 0's fsync and rename), each failing
// as a full disk (ENOSPC).
#pragma once

#include <cstdint>

namespace ringtrain {

// The rank this process is; set once by launch/ at start-up (core knows no MPI).
void set_fault_rank(int rank);
// Throws when RINGTRAIN_TEST_FAIL names this rank, `point` and `step` (-1: any step).
void maybe_inject_fault(const char* point, int64_t step = -1);
// Whether RINGTRAIN_TEST_FAIL names this rank, `point` and `step`: for the points where the
// caller simulates the failure itself (an errno) instead of throwing.
bool fault_requested(const char* point, int64_t step = -1);

// Test-only stall: RINGTRAIN_TEST_STALL=RANK:STEP:SECONDS[:gather|:reduce] holds rank RANK
// back for SECONDS before step STEP, before its all-gather of that step under --zero 1, or
// inside its gradient reduction of that step before it joins the first bucket's collective;
// in `ringtrain doctor`, STEP 0 holds it back before the link tests (multinode doctor.sh)
// (the stall detection and flight-recorder tests, tests/e2e/stall.sh, zero.sh and
// diagnose.sh). rank -1: no stall.
struct StallHook {
  int rank = -1;
  int64_t step = 0;
  double seconds = 0;
  bool gather = false, reduce = false;
};
StallHook stall_hook();

// Test-only straggler: RINGTRAIN_TEST_SLOW_FORWARD=RANK:MS makes rank RANK sleep MS
// milliseconds in every forward (tests/e2e/diagnose.sh). rank -1: none.
struct SlowHook {
  int rank = -1;
  double seconds = 0;
};
SlowHook slow_forward_hook();

}  // namespace ringtrain
