// One Chrome trace for a whole data-parallel job: every rank's events (core/trace.h) in one JSON file
// that Perfetto (ui.perfetto.dev) and chrome://tracing open, one process per rank ("rank r") with a
// "compute" and a "communication" thread; and the figure a timeline is read for: how much of the
// communication time was hidden behind compute.
#pragma once

#include <string>
#include <vector>

#include "core/trace.h"
#include "distributed/comm/communicator.h"

namespace zero::dist {

/// Communication seen in one rank's events: `comm_us`, the time the communication thread spent in
/// collectives (its "comm" spans), and `exposed_us`, the part of that time during which the training
/// thread was blocked waiting for communication (its "wait" spans). The rest overlapped compute.
struct OverlapSummary {
  double comm_us = 0;
  double exposed_us = 0;
  /// 1 - exposed / comm (0 when there was no communication).
  double hidden_fraction() const { return comm_us > 0 ? 1.0 - exposed_us / comm_us : 0.0; }
};

/// Computes the summary from one rank's events (interval intersection; events in any order).
OverlapSummary overlap_summary(const std::vector<trace::Event>& events);

/// Collective over `comm`: gathers every rank's `events` to rank 0, which writes them to `path` as
/// {"traceEvents": [...], "displayTimeUnit": "ms"} with pid = rank and process/thread name metadata.
/// The gather moves the JSON text through comm.all_gather; the ledger is restored afterwards, so the
/// job's traffic figures do not include it. Throws zero::Error on rank 0 if the file cannot be written.
void write_trace(const std::string& path, Communicator& comm, const std::vector<trace::Event>& events);

}  // namespace zero::dist
