// `ringtrain doctor` (and `train --preflight`): a pre-flight check of the job's ranks, nodes
// and links before a long run. Every rank measures an fp32 GEMM rate and its memory
// bandwidth at the same moment (as training loads them); each rank measures latency and
// bandwidth to its ring neighbour, and the leaders of every node pair to each other. Rank 0
// prints one table and marks an outlier: a rate below --outlier times the upper quartile of
// its kind (ranks; links within a node; links between nodes), a latency above that quartile
// divided by --outlier. docs/usage.md, "Checking nodes and links before a run".
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace ringtrain::launch {

struct DoctorConfig {
  int threads = 0;           // per rank; 0: as for train
  int64_t gemm_size = 1024;  // n of the n x n x n fp32 GEMM
  int64_t stream_mib = 64;   // MiB per array of the memory-bandwidth triad (three arrays)
  int64_t message_mib = 4;   // MiB per bandwidth message
  double seconds = 0.3;      // how long each measurement runs (GEMM, triad, each link)
  double outlier = 0.7;      // marked below this fraction of the upper quartile
  double timeout = 60;       // seconds to wait for a partner rank before the job ends
  bool strict = false;       // exit 2 when anything is marked
  std::string bad_hosts;     // file: the hosts of marked ranks and nodes, one per line
};

bool parse_doctor(const std::vector<std::string>& args, DoctorConfig& cfg, std::string* help);

// Runs the check on every rank of `comm` (collective) and prints the table on rank 0.
// Returns the number of marked outliers (the same on every rank).
int run_doctor(const DoctorConfig& cfg, comm::Communicator& comm);

int cmd_doctor(const std::vector<std::string>& args, comm::Communicator& comm);

}  // namespace ringtrain::launch
