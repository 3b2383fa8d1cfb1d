#include "examples/preemption.h"

#include <fmt/format.h>

#include <signal.h>

#include <atomic>
#include <cstdlib>

namespace zero::examples {

// Note [Preemption]
// ~~~~~~~~~~~~~~~~~
// A scheduler that preempts a job sends SIGTERM and, after a grace period (SLURM's KillWait, 30 s by
// default; Kubernetes' terminationGracePeriodSeconds, 30 s), SIGKILL. Ctrl-C sends SIGINT. The handler
// only counts; the training loop looks at the count at the end of every step, so a step, its logging,
// evaluation and periodic checkpoint always finish. The ranks must agree on the step they stop after
// (each must take part in the same collectives, and the checkpoint must be one step's state on all of
// them), but a signal reaches them at different instants, or reaches only some: so every step ends with
// one scalar all-reduce (max) of each rank's request, and all ranks stop after the first step at whose
// end any rank had one. The run then saves a checkpoint of that step (as --save-every would; none if
// one of that step was just saved), prints one line, `stopped by SIGTERM after step 37/2000: ...`
// naming the checkpoint and the command that resumes, and exits with 128 + the signal, the shell's
// convention for "ended by a signal" (143 for SIGTERM, 130 for SIGINT).
//
// A second signal means "now": a rank that has one before the checkpoint is committed (the rename of its
// temporary directory, distributed/run/checkpoint.cpp) makes every rank abandon it, so the previous
// checkpoint stays the newest; at a step boundary it skips the save altogether. A third signal gets its
// default action: the process ends at once (and the crash-safe checkpoint format keeps every earlier
// checkpoint loadable).
//
// mpirun (Open MPI 4) does not pass SIGTERM or SIGINT on as they are: it aborts the job, sending SIGTERM
// to every rank and SIGKILL one second later (odls_base_sigkill_timeout), while it stops relaying their
// output. It does forward SIGUSR1 and SIGUSR2 unchanged, so SIGUSR1 is a stop request here too:
// scripts/launch.sh turns a SIGTERM or SIGINT it receives into a SIGUSR1 to mpirun, and under SLURM,
// `sbatch --signal=B:USR1@60` or srun (which forwards SIGTERM to every task) do the same.

namespace {

std::atomic<int> g_requests{0};
std::atomic<int> g_signal{0};

void on_stop_signal(int signal) {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);  // the first one names the stop
  if (g_requests.fetch_add(1) + 1 >= 2) {
    // The next one gets the default action (ends the process).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int s : {SIGTERM, SIGINT, SIGUSR1}) sigaction(s, &dfl, nullptr);
  }
}

// Single quotes around anything a shell would split or expand.
std::string shell_quote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                              "-_./=:,+@%") == std::string::npos)
    return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;  // system calls in flight (writes, waits) carry on
  sigemptyset(&action.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) sigaction(s, &action, nullptr);
  // A file-size limit (ulimit -f) then fails the write (EFBIG), which the program reports in one line,
  // instead of killing the process.
  signal(SIGXFSZ, SIG_IGN);
}

int stop_requests() { return g_requests.load(); }
int stop_signal() { return g_signal.load(); }

StopDecision agree_to_stop(dist::Communicator& comm) {
  // One number per rank: min(requests, 2) * 256 + signal; the maximum carries the most requests seen
  // on any rank (and a signal of that rank).
  const int requests = std::min(stop_requests(), 2);
  double code = requests > 0 ? requests * 256.0 + stop_signal() : 0.0;
  if (comm.world_size() > 1) code = comm.all_reduce_max(code);
  StopDecision d;
  const int agreed = static_cast<int>(code);
  d.stop = agreed >= 256;
  d.abandon_save = agreed >= 512;
  d.signal = agreed % 256;
  return d;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return fmt::format("signal {}", signal);
  }
}

std::string resume_command(const std::vector<std::string>& argv, const std::string& save_dir, int world) {
  std::vector<std::string> words;
  std::size_t first = 1;
  if (const char* launcher = std::getenv("ZERO_LAUNCHER"); launcher != nullptr && *launcher != '\0') {
    words.push_back(launcher);  // already a command line: not quoted again
    if (const char* added = std::getenv("ZERO_LAUNCHER_ARGS")) first += static_cast<std::size_t>(std::atoi(added));
  } else {
    // mpirun's own options (--hostfile, --allow-run-as-root, ...) never reach the program: a placeholder
    // says where they go rather than a command that would fail without them.
    if (world > 1) words.push_back("mpirun [the options it was launched with; any -np]");
    words.push_back(shell_quote(argv.empty() ? "train_gpt" : argv[0]));
  }
  for (std::size_t i = first; i < argv.size(); ++i) {
    const std::string& w = argv[i];
    if (w == "--resume" || w == "--init-from") {
      ++i;  // and its value
      continue;
    }
    if (w.rfind("--resume=", 0) == 0 || w.rfind("--init-from=", 0) == 0) continue;
    words.push_back(shell_quote(w));
  }
  words.push_back("--resume");
  words.push_back(shell_quote(save_dir));
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace zero::examples
