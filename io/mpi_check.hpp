// IO_MPI_CHECK: the MPI calls of io/'s parallel writers (checkpoints, converters) checked like
// every foreign call (MPI_ERRORS_RETURN is set), throwing ringtrain::Error with the rank, the
// statement and MPI's error string. io/ does not include comm/ (docs/architecture.md), so it
// has this short form of comm/mpi/mpi_check.hpp's MPI_CHECK.
#pragma once

#include <mpi.h>

#include <string>

#include "core/error.hpp"

namespace ringtrain::io {

inline std::string mpi_failure(int code, const char* stmt) {
  char err[MPI_MAX_ERROR_STRING] = {0};
  int len = 0, rank = -1;
  MPI_Error_string(code, err, &len);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return cat("rank ", rank, ": ", stmt, " failed: ", err);
}

}  // namespace ringtrain::io

#define IO_MPI_CHECK(stmt)                                                            \
  do {                                                                                \
    const int rt_io_mpi_rc_ = (stmt);                                                 \
    if (rt_io_mpi_rc_ != MPI_SUCCESS)                                                 \
      ::ringtrain::throw_runtime(__FILE__, __LINE__,                                  \
                                 ::ringtrain::io::mpi_failure(rt_io_mpi_rc_, #stmt)); \
  } while (0)
