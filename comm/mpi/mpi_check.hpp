// MPI_CHECK: wraps every MPI call; on failure throws ringtrain::Error with the rank, host,
// file:line, the statement and MPI's own error string.
#pragma once

#include <mpi.h>

#include <string>

#include "core/error.hpp"

namespace ringtrain::comm {
std::string mpi_error_context(int code, const char* stmt);  // "rank 3 on node07: ... : <MPI error>"
}

#define MPI_CHECK(stmt)                                                                    \
  do {                                                                                     \
    int rt_mpi_rc_ = (stmt);                                                               \
    if (rt_mpi_rc_ != MPI_SUCCESS)                                                         \
      ::ringtrain::throw_runtime(__FILE__, __LINE__,                                       \
                                 ::ringtrain::comm::mpi_error_context(rt_mpi_rc_, #stmt)); \
  } while (0)
