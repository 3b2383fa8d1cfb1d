#include "distributed/comm/control_channel.h"

#include <mpi.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "distributed/comm/mpi_check.h"

namespace zero::dist::control_channel {

namespace {

constexpr int kNoticeTag = 77;

// MPI_COMM_WORLD duplicated, and what each rank has posted on it.
struct Channel {
  std::mutex mutex;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::vector<Notice> notice;      // per world rank: the first notice received from it
  int posted = int(Notice::none);  // what this rank posted (the send buffer)
  std::vector<MPI_Request> sends;
};

// Never destroyed: the exit-time finaliser of the job runtime still needs it, and it is created after
// that finaliser's state, so as a plain static it would be destroyed first.
Channel& channel() {
  static Channel* c = new Channel;
  return *c;
}

// Receives every notice that has arrived. Caller holds c.mutex.
void receive_notices(Channel& c) {
  if (c.comm == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, c.comm, &flag, &status) != MPI_SUCCESS || !flag) return;
    int kind = int(Notice::none);
    MPI_Recv(&kind, 1, MPI_INT, status.MPI_SOURCE, kNoticeTag, c.comm, MPI_STATUS_IGNORE);
    Notice& slot = c.notice[static_cast<std::size_t>(status.MPI_SOURCE)];
    if (slot == Notice::none) slot = static_cast<Notice>(kind);
  }
}

}  // namespace

void open() {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  if (c.comm != MPI_COMM_NULL) return;
  ZERO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c.comm));
  ZERO_MPI_CHECK(MPI_Comm_set_errhandler(c.comm, MPI_ERRORS_RETURN));
  ZERO_MPI_CHECK(MPI_Comm_rank(c.comm, &c.rank));
  ZERO_MPI_CHECK(MPI_Comm_size(c.comm, &c.size));
  c.notice.assign(static_cast<std::size_t>(c.size), Notice::none);
}

bool is_open() {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  return c.comm != MPI_COMM_NULL;
}

int rank() {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  return c.rank;
}

int size() {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  return c.size;
}

std::optional<GonePeer> first_gone_peer() {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  receive_notices(c);
  for (int r = 0; r < c.size; ++r) {
    const Notice n = c.notice[static_cast<std::size_t>(r)];
    if (r != c.rank && n != Notice::none) return GonePeer{r, n == Notice::leaving};
  }
  return std::nullopt;
}

void post_notice(Notice notice) {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  if (c.posted != int(Notice::none)) return;
  c.posted = int(notice);
  for (int r = 0; r < c.size; ++r) {
    if (r == c.rank) continue;
    c.sends.emplace_back();
    if (MPI_Isend(&c.posted, 1, MPI_INT, r, kNoticeTag, c.comm, &c.sends.back()) != MPI_SUCCESS)
      c.sends.pop_back();
  }
}

std::vector<int> wait_for_notices(double seconds) {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  const double deadline = MPI_Wtime() + seconds;
  std::vector<int> silent;
  for (;;) {
    receive_notices(c);
    if (!c.sends.empty()) {
      int done = 0;
      MPI_Testall(static_cast<int>(c.sends.size()), c.sends.data(), &done, MPI_STATUSES_IGNORE);
    }
    silent.clear();
    for (int r = 0; r < c.size; ++r)
      if (r != c.rank && c.notice[static_cast<std::size_t>(r)] == Notice::none) silent.push_back(r);
    if (silent.empty() || MPI_Wtime() > deadline) return silent;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Notice notice_from(int rank) {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  return c.notice[static_cast<std::size_t>(rank)];
}

void close() {
  Channel& c = channel();
  std::lock_guard lock(c.mutex);
  if (c.comm == MPI_COMM_NULL) return;
  if (!c.sends.empty()) MPI_Waitall(static_cast<int>(c.sends.size()), c.sends.data(), MPI_STATUSES_IGNORE);
  c.sends.clear();
  MPI_Comm_free(&c.comm);
  c.comm = MPI_COMM_NULL;
}

}  // namespace zero::dist::control_channel
