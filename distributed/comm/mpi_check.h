// ZERO_MPI_CHECK: an MPI call's error code turned into a zero::Error, for the MPI communicator and the
// job runtime. Our communicators use MPI_ERRORS_RETURN, so failures reach this check instead of
// aborting the job.
#pragma once

#include <fmt/format.h>
#include <mpi.h>

#include <string>

#include "core/check.h"

namespace zero::dist::detail {

/// "<call> failed: <MPI's error string> (MPI error <code>)".
inline std::string mpi_error_message(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  return fmt::format("{} failed: {} (MPI error {})", call, std::string(text, length), code);
}

}  // namespace zero::dist::detail

/// Throws zero::Error naming the call and MPI's error string unless `call` returns MPI_SUCCESS.
#define ZERO_MPI_CHECK(call)                                                                     \
  do {                                                                                           \
    const int zero_mpi_rc_ = (call);                                                             \
    if (zero_mpi_rc_ != MPI_SUCCESS)                                                             \
      ::zero::detail::fail(__FILE__, __LINE__,                                                   \
                           ::zero::dist::detail::mpi_error_message(#call, zero_mpi_rc_));        \
  } while (0)
