// Stopping a training run on request: SIGTERM (what SLURM and Kubernetes send before they preempt a
// job), SIGINT (Ctrl-C) or SIGUSR1 (what mpirun forwards to every rank as it is, and what SLURM's
// --signal=USR1@T sends ahead of a time limit). Note [Preemption] in preemption.cpp has the protocol:
// every rank stops after the same step, the run saves a checkpoint there, prints one line naming it and
// the command that resumes, and exits with 128 + the signal; a second signal abandons that save.
#pragma once

#include <string>
#include <vector>

#include "distributed/distributed.h"

namespace zero::examples {

/// Installs the handlers for SIGTERM, SIGINT and SIGUSR1 (async-signal-safe: they count, and remember
/// the first signal). The first two requests are handled at step boundaries; a third ends the process
/// at once (the signal's default action). Also ignores SIGXFSZ, so a write past a file-size limit
/// fails with an error (reported like a full disk) instead of ending the process.
void install_stop_handlers();

/// Signals this process received since install_stop_handlers(), and the first one (0 if none).
int stop_requests();
int stop_signal();

struct StopDecision {
  bool stop = false;          // every rank stops after this step
  bool abandon_save = false;  // some rank was asked twice: stop without saving
  int signal = 0;             // the signal to report and exit with (128 + signal)
};

/// At a step boundary, the same answer on every rank: whether any rank has been asked to stop. One
/// scalar all-reduce (max) over `comm` when it has several ranks (a control collective: it is not
/// counted as traffic); none on one rank.
StopDecision agree_to_stop(dist::Communicator& comm);

/// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
std::string signal_name(int signal);

/// The command that continues this run from `save_dir`: `argv` with any --resume/--init-from (and
/// their values) replaced by `--resume save_dir`, shell-quoted, behind "mpirun [the options it was
/// launched with; any -np]" when world > 1 (mpirun's options are not known to the program; `world` is
/// only tested for > 1).
/// A launcher that wraps train_gpt names itself instead through the environment: ZERO_LAUNCHER (e.g.
/// "scripts/launch.sh -n 4") replaces the program name, and ZERO_LAUNCHER_ARGS (a count) drops that
/// many leading arguments, the ones the launcher added.
std::string resume_command(const std::vector<std::string>& argv, const std::string& save_dir, int world);

}  // namespace zero::examples
