// The whole public distributed API in one include: what a training program needs to run data-parallel
// with ZeRO (stages 0-3), from any of the three rooms of distributed/ (the layout table in
// docs/architecture.md says what each may include):
//
//   comm/  communication: Communicator (communicator.h); its implementations' factories: mpi_world(),
//          finalize_mpi(), fail_job() and the rest of the job runtime (job_runtime.h), MpiCommunicator
//          (mpi_communicator.h), make_inprocess_world() and run_ranks() (inprocess_communicator.h), and
//          with the CUDA backend NcclCommunicator, nccl_usable() and make_host_staged()
//          (nccl_communicator.h);
//   zero/  the ZeRO algorithm: ZeroOptimizer (zero_optimizer.h), ZeroOptions and ZeroPlan (zero_plan.h);
//   run/   the run's state: TrainingConfig, read_config_file(), merge_config() (config.h), the settings
//          table (settings.h), save_checkpoint() / load_checkpoint() (checkpoint.h), the resume read
//          plan read_plan() (read_plan.h), write_trace() (trace_file.h).
//
// The parts ZeroOptimizer is built from (gradient_reducer.h, parameter_gather.h, ...) come along as its
// members' types; the helpers of the collectives (quantize.h, ring_math.h, cpu_work.h, control_channel.h)
// do not. Code inside distributed/ includes each header it uses by its path, never this one (the
// include_layers test says so).
#pragma once

#include "distributed/comm/communicator.h"
#include "distributed/comm/inprocess_communicator.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/comm/mpi_communicator.h"
#ifdef ZERO_HAS_CUDA
#include "distributed/comm/nccl_communicator.h"
#endif
#include "distributed/run/checkpoint.h"
#include "distributed/run/config.h"
#include "distributed/run/read_plan.h"
#include "distributed/run/settings.h"
#include "distributed/run/trace_file.h"
#include "distributed/zero/zero_optimizer.h"
#include "distributed/zero/zero_plan.h"
