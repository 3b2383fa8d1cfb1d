// The control channel: how the ranks of a job tell each other that one of them failed or is leaving,
// so that no rank waits in a collective for a peer that will never come (Note [No hang] in
// job_runtime.cpp).
//
// It is MPI_COMM_WORLD duplicated, on which each rank posts at most one notice (one int) to every
// other rank. Two parties use it, one at a time (a mutex guards the channel and its MPI calls):
//   - a collective that waits (MpiCommunicator's wait loop, mpi_communicator.cpp; with a second channel,
//     Communicator::duplicate, two communication threads) asks, about once a millisecond, "has a peer
//     left or failed?": first_gone_peer();
//   - the job runtime (finalize_mpi, fail_job in job_runtime.h), once the communication thread is
//     joined, posts this rank's notice and waits for every peer's: post_notice(), wait_for_notices();
//     then close().
// The job runtime opens it (mpi_world()). Until then, and in a job of one rank, first_gone_peer()
// reports nobody.
#pragma once

#include <optional>
#include <vector>

namespace zero::dist::control_channel {

/// What a rank posts (its first post is the one its peers see).
enum class Notice : int {
  none = 0,
  failed = 1,        // failed with an error of its own
  failed_after = 2,  // failed only because another rank had (prints nothing)
  leaving = 3,       // finalising MPI: done with every collective
};

/// Seconds a collective still waits after a peer's notice arrived before it gives up on that peer:
/// the peer may have finished its part of the collective before posting (messages on two
/// communicators are not ordered).
inline constexpr double kGoneGraceSeconds = 1.0;

/// Duplicates MPI_COMM_WORLD for the channel. Collective over every rank; MPI must be initialised.
/// Does nothing when the channel is already open. Throws zero::Error if an MPI call fails.
void open();
/// Whether open() has run and close() has not.
bool is_open();
/// This rank and the number of ranks on the channel since open() (0 and 1 before).
int rank();
int size();

/// A peer that has posted a notice. left: it is leaving without having failed (Notice::leaving).
struct GonePeer {
  int rank;
  bool left;
};
/// "Has a peer left or failed?": receives every notice that has arrived and returns the lowest-numbered
/// other rank that has posted one, or nothing. What a waiting collective asks.
std::optional<GonePeer> first_gone_peer();

/// "Post my notice": sends `notice` to every other rank without waiting for delivery. Only the first
/// call posts; later ones do nothing.
void post_notice(Notice notice);
/// Waits until every other rank has posted a notice or `seconds` have passed, receiving as they come;
/// returns the ranks that stayed silent, in increasing order.
std::vector<int> wait_for_notices(double seconds);
/// The first notice received from `rank` (Notice::none when it has posted nothing yet).
Notice notice_from(int rank);

/// Completes the notices this rank sent (call it once every peer has answered, else it may block) and
/// frees the channel. Does nothing when it is not open.
void close();

}  // namespace zero::dist::control_channel
