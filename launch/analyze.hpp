// `ringtrain analyze DIR`: reads the flight-recorder dumps of a job (one JSON-lines file per
// rank, docs/formats.md) and says where it hung and who is slow: the first collective
// sequence number where the ranks diverge, which ranks never entered or never left it (with
// their hosts), the phase each rank was in, and the per-rank time per phase with the slowest
// rank. Missing ranks and partial files (a job killed while writing) are named, and the rest
// is analysed.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace ringtrain::launch {

// The report for the dumps in `dir` (the lines `ringtrain analyze` prints). Throws an input
// error when `dir` holds no dump.
std::string analyze_flight_dumps(const std::string& dir);

int cmd_analyze(const std::vector<std::string>& args, comm::Communicator& comm);

}  // namespace ringtrain::launch
