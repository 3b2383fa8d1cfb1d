// leave_early: a small MPI job in which the last rank leaves at step 3 in a chosen way while the others
// go on into a collective, for the "no hang" tests (tests/unit/test_train_gpt_cli.cpp). Every rank
// runs 8 steps of one all-reduce each; the surviving ranks must end the job within their collective
// timeout ($ZERO_COLLECTIVE_TIMEOUT_S) plus a few seconds, printing one line for the whole job.
//
//   mpirun -np 4 -x ZERO_COLLECTIVE_TIMEOUT_S=2 leave_early MODE
//
// MODE, what the last rank does at step 3 instead of its all-reduce:
//   return  returns from main (exit code 0; MPI is finalised at exit)
//   exit    calls std::exit(0)
//   throw   fails with an error of its own (fail_job)
//   stuck   sleeps for ten minutes (stands for a hang, or a dropped connection)
//   crash   std::abort()
//   kill    raises SIGKILL
//   none    nothing: the job succeeds
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "distributed/comm/job_runtime.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "none";
  try {
    auto comm = zero::dist::mpi_world();
    const int last = comm->world_size() - 1;
    std::vector<float> buf(1000, 1.0f);
    for (int step = 1; step <= 8; ++step) {
      comm->set_step(step);
      if (step == 3 && comm->rank() == last && comm->world_size() > 1) {
        if (mode == "return") return 0;
        if (mode == "exit") std::exit(0);
        if (mode == "throw") throw zero::Error("injected failure on the last rank");
        if (mode == "stuck") std::this_thread::sleep_for(std::chrono::minutes(10));
        if (mode == "crash") std::abort();
        if (mode == "kill") std::raise(SIGKILL);
      }
      comm->all_reduce(buf.data(), buf.size(), zero::DType::f32);
    }
    if (comm->rank() == 0) std::printf("done: %g\n", static_cast<double>(buf[0]));
    return 0;
  } catch (const std::exception& e) {
    zero::dist::fail_job(e);
  }
}
