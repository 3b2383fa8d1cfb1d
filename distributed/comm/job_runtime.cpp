#include "distributed/comm/job_runtime.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "distributed/comm/control_channel.h"
#include "distributed/comm/mpi_check.h"
#include "distributed/comm/mpi_communicator.h"

namespace zero::dist {

// Note [No hang]
// A collective waits for its peers, so a peer that never arrives would hang the job. Three guards:
//   - a deadline: each collective must finish within the communicator's timeout (set_timeout,
//     $ZERO_COLLECTIVE_TIMEOUT_S, default 300 s), measured from when this rank starts waiting; past it
//     the point-to-point requests still pending are cancelled (a collective's never are: Note [Never
//     cancel a collective] in mpi_communicator.cpp) and CollectiveTimeout names the collective, the step and
//     the peers whose messages never came. That covers a peer that is stuck, or whose connection
//     dropped without an MPI error;
//   - a control channel (control_channel.h): a duplicate of MPI_COMM_WORLD on which a rank posts a
//     small notice when it fails (fail_job) or leaves (MPI finalisation, which also runs when main
//     returns early). The wait loop of every collective (MpiCommunicator::wait_all) probes it about
//     once a millisecond; once a peer's notice is in, the collective gets a short grace (the peer may
//     have finished its part before leaving: messages on two communicators are not ordered) and then
//     fails with PeerGone, so the others stop in about a second instead of waiting out the timeout;
//   - a rank that crashes or is killed is Open MPI's to handle: its runtime ends the whole job as soon
//     as a process dies without finalising. A crashing rank (SIGSEGV, SIGABRT, ...) first prints one
//     line of ours from a signal handler; a killed one (SIGKILL) cannot, and mpirun reports it.
// After any failure the communicator is "broken": the ranks are out of step, so every later
// collective fails at once. Ending the job cleanly, with one line, is fail_job's work (below).

namespace {

using control_channel::Notice;

std::atomic<int> g_world_rank{-1};  // for abort_job's message; read without calling MPI

// "0, 2, 3"
std::string rank_list(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ", ")); }

struct WorldState {
  std::mutex mutex;
  std::shared_ptr<MpiCommunicator> comm;
  bool initialised_by_us = false;
  bool finalised = false;
  double timeout_s = 300.0;  // the world communicator's, when it was shut down

  // Runs at exit if finalize_mpi() was not called: the thread must be joined before MPI_Finalize.
  ~WorldState() {
    try {
      finalize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: finalising MPI failed: %s\n", g_world_rank.load(), e.what());
    }
  }

  // Joins the communication thread (first making it give up waiting when `abandon`).
  void stop_comm(bool abandon) {
    if (!comm) return;
    timeout_s = comm->timeout();
    if (abandon) comm->abandon();
    comm->shutdown();
    comm.reset();
  }

  void finalize() {
    std::lock_guard lock(mutex);
    if (finalised) return;
    finalised = true;
    stop_comm(false);
    int done = 0;
    MPI_Finalized(&done);
    if (!initialised_by_us || done) return;
    // Note [No hang]: say we are leaving, so a rank still waiting for us stops now; then wait (like a
    // barrier, up to the collective timeout) for the others to leave or fail before finalising.
    if (control_channel::size() > 1) {
      control_channel::post_notice(Notice::leaving);
      const std::vector<int> silent = control_channel::wait_for_notices(timeout_s);
      if (!silent.empty()) {
        // Printed by the lowest-numbered rank that got here (the others stay quiet).
        bool lowest = true;
        for (int r = 0; r < control_channel::rank(); ++r)
          if (control_channel::notice_from(r) == Notice::leaving) lowest = false;
        if (lowest)
          std::fprintf(stderr, "error: rank(s) %s did not reach the end of the job within %g s of the others\n",
                       rank_list(silent).c_str(), timeout_s);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      control_channel::close();
    }
    MPI_Finalize();
  }
};

WorldState& world_state() {
  static WorldState state;
  return state;
}

// A rank that crashes is ended by Open MPI, which then ends the others; before that it says so in one
// line of ours (the others are killed and print nothing). Async-signal-safe: write(2) and raise only.
char g_crash_prefix[64];
std::size_t g_crash_prefix_length = 0;

void on_crash(int signal) {
  char digits[8];
  std::size_t n = 0;
  for (int v = signal; v > 0 && n < sizeof digits; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  char line[96];
  std::size_t len = 0;
  for (std::size_t i = 0; i < g_crash_prefix_length; ++i) line[len++] = g_crash_prefix[i];
  while (n > 0) line[len++] = digits[--n];
  line[len++] = ')';
  line[len++] = '\n';
  [[maybe_unused]] const auto written = ::write(2, line, len);
  std::raise(signal);  // SA_RESETHAND: the default action now (core dump / termination)
}

void install_crash_handlers(int rank) {
  const int len = std::snprintf(g_crash_prefix, sizeof g_crash_prefix, "error: rank %d: crashed (signal ", rank);
  g_crash_prefix_length = len > 0 ? static_cast<std::size_t>(len) : 0;
  struct sigaction action {};
  action.sa_handler = on_crash;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &action, nullptr);
}

}  // namespace

std::shared_ptr<Communicator> mpi_world() {
  WorldState& state = world_state();
  std::lock_guard lock(state.mutex);
  ZERO_CHECK(!state.finalised, "mpi_world(): MPI was already finalised");
  if (!state.comm) {
    int initialised = 0;
    ZERO_MPI_CHECK(MPI_Initialized(&initialised));
    if (!initialised) {
      int provided = MPI_THREAD_SINGLE;
      // MULTIPLE where the library has it: a second channel (Communicator::duplicate, ZeRO stage 3)
      // runs a second communication thread; one channel needs only SERIALIZED.
      ZERO_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      state.initialised_by_us = true;
    }
    control_channel::open();
    state.comm = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD);
    g_world_rank = state.comm->rank();
    if (state.comm->world_size() > 1) install_crash_handlers(state.comm->rank());
  }
  return state.comm;
}

void finalize_mpi() { world_state().finalize(); }

void fail_job(const std::exception& error, bool verbose, int exit_code) {
  std::string message = error.what();
  const auto* zero_error = dynamic_cast<const Error*>(&error);
  if (verbose && zero_error && !zero_error->location().empty()) message += " (" + zero_error->location() + ")";
  const auto* gone = dynamic_cast<const PeerGone*>(&error);
  const bool caused_here = !(gone && !gone->departed());
  std::fflush(stdout);

  WorldState& state = world_state();
  int initialised = 0;
  int finalised = 0;
  MPI_Initialized(&initialised);
  // An error found before MPI started, in a job of several ranks: start MPI now, so the ranks can agree
  // on who prints (otherwise the launcher may end rank 0 before it has said anything).
  if (!initialised && launcher_size() > 1) {
    try {
      mpi_world();
    } catch (const std::exception&) {
    }
    MPI_Initialized(&initialised);
  }
  MPI_Finalized(&finalised);
  if (!initialised || finalised || !control_channel::is_open() || control_channel::size() == 1) {
    // One process (or MPI could not start under a launcher: then the launcher's rank 0 says it).
    if (launcher_rank() == 0 || (initialised && !finalised)) std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    if (initialised && !finalised) {
      state.stop_comm(true);
      state.finalised = true;
      control_channel::close();
      MPI_Finalize();
    }
    std::exit(exit_code);
  }
  {
    std::lock_guard lock(state.mutex);
    state.stop_comm(true);
    state.finalised = true;  // this function finalises (or aborts); the exit-time finaliser must not
  }
  // Long enough for a peer waiting in a collective to see the notice, sit out its grace and answer.
  control_channel::post_notice(caused_here ? Notice::failed : Notice::failed_after);
  const std::vector<int> silent =
      control_channel::wait_for_notices(control_channel::kGoneGraceSeconds + std::min(state.timeout_s, 3.0));
  if (caused_here) {
    const int me = control_channel::rank();
    bool lowest = true, everyone = true;
    for (int r = 0; r < control_channel::size(); ++r) {
      if (r == me) continue;
      const Notice n = control_channel::notice_from(r);
      if (n == Notice::failed && r < me) lowest = false;
      if (n != Notice::failed) everyone = false;
    }
    if (const auto* t = dynamic_cast<const CollectiveTimeout*>(&error); t && !silent.empty())
      message = fmt::format("{} at step {} timed out after {:g} s: rank(s) {} did not arrive", t->collective(),
                            t->step(), t->seconds(), rank_list(silent));
    if (lowest) {
      if (everyone)
        std::fprintf(stderr, "error: %s\n", message.c_str());
      else
        std::fprintf(stderr, "error: rank %d: %s\n", me, message.c_str());
    }
  }
  std::fflush(stderr);
  // A rank that never answered is stuck (stopped, or cut off): MPI_Finalize would wait for it and
  // MPI_Abort prints Open MPI's own banner in front of our line. Exiting without finalising ends
  // the job the same way (mpirun stops the other ranks when one exits with a non-zero code).
  if (!silent.empty()) std::_Exit(exit_code);
  control_channel::close();
  MPI_Finalize();
  std::exit(exit_code);
}

void abort_job(const std::string& message) {
  int initialised = 0;
  int finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  int rank = g_world_rank.load();
  if (rank < 0 && initialised && !finalised) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "rank %d: %s\n", std::max(rank, 0), message.c_str());
  std::fflush(stderr);
  // MPI_Abort from this thread while the communication thread may be inside MPI bends
  // MPI_THREAD_SERIALIZED, but it is the only way to end the ranks that wait on us.
  if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

int launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 1;
}

}  // namespace zero::dist
