// The job runtime: MPI's lifetime, the world communicator, and how a job of several ranks ends —
// normally, after an error on some of its ranks, or after a crash — with ONE error line for the whole
// job and never a hang (Note [No hang] in job_runtime.cpp).
//
// This is machinery of the job, kept apart from the collectives (mpi_communicator.h) so that those
// read on their own. The two meet at the control channel (control_channel.h): a waiting collective
// asks it whether a peer has left or failed; this runtime posts this rank's notice on it when the
// rank fails (fail_job) or leaves (finalize_mpi).
//
// mpi_world() lives here, not beside MpiCommunicator, because creating the world communicator is
// where a job starts: it initialises MPI, opens the control channel, installs the crash handlers and
// arranges for MPI to be finalised at exit. MpiCommunicator itself only needs an MPI communicator.
#pragma once

#include <exception>
#include <memory>
#include <string>

#include "distributed/comm/communicator.h"

namespace zero::dist {

/// The communicator over MPI_COMM_WORLD (an MpiCommunicator), created on first use. Initialises MPI
/// (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE, which a second channel needs: Communicator::duplicate)
/// unless it already is; a program started without mpirun
/// gets world_size 1. It also opens the control channel and, with several ranks, installs handlers for
/// SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT that print "error: rank R: crashed (signal N)" before
/// the default action (Open MPI then ends the job).
/// MPI is finalised at exit (after the communication thread is joined), or earlier by finalize_mpi().
/// Throws zero::Error if MPI cannot give MPI_THREAD_SERIALIZED or was already finalised.
std::shared_ptr<Communicator> mpi_world();

/// Shuts down the world communicator (joins its thread) and calls MPI_Finalize if mpi_world()
/// initialised MPI. Collective: every rank must call it. Idempotent; runs automatically at exit, so a
/// rank that returns from main early also passes here: it posts a "leaving" notice on the control
/// channel first, so ranks still waiting for it in a collective fail at once (PeerGone) instead of
/// waiting out their timeout, and it waits (up to the collective timeout) for every other rank to
/// leave or fail before finalising (Note [No hang]).
void finalize_mpi();

/// Ends this rank after `error`, and with it the job, printing ONE line for the whole job:
///   - every rank hit an error: rank 0 prints "error: <message>";
///   - some ranks did: the lowest-numbered of them prints "error: rank R: <message>";
///   - a rank that fails only because another one did (PeerGone from a failed peer) prints nothing.
/// A CollectiveTimeout's message names the ranks that sent no notice within a short grace (the ones
/// that did not arrive). `verbose` appends the C++ source location of a zero::Error. The rank posts a
/// "failed" notice on the control channel (so peers waiting for it stop at once), waits up to
/// 1 s + min(timeout, 3 s) for every rank to fail or leave, then finalises MPI and exits with
/// `exit_code`; when a rank never answers (stuck) it exits with `exit_code` without finalising, and
/// mpirun ends the stuck rank. An error found before
/// MPI started, in a job of several ranks (launcher_size() > 1), starts MPI first so the ranks can
/// agree on who prints; a single process prints the line and exits.
[[noreturn]] void fail_job(const std::exception& error, bool verbose = false, int exit_code = 1);

/// Prints "rank R: message" to stderr and ends the whole job: MPI_Abort(MPI_COMM_WORLD, 1) when MPI
/// is initialised, std::exit(1) otherwise. The last resort; programs report errors with fail_job.
[[noreturn]] void abort_job(const std::string& message);

/// This process's rank as the launcher (mpirun) numbered it, read from the environment without
/// calling MPI (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK); 0 when not started by a launcher.
int launcher_rank();
/// The number of ranks the launcher started (OMPI_COMM_WORLD_SIZE, PMIX_SIZE, PMI_SIZE); 1 without one.
int launcher_size();

}  // namespace zero::dist
