#include "distributed/run/trace_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "core/check.h"

namespace zero::dist {

namespace {

using Interval = std::pair<double, double>;

// Sorted, non-overlapping union of `v`.
std::vector<Interval> merge(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

nlohmann::json to_json(const trace::Event& e, int pid) {
  nlohmann::json j = {{"name", e.name}, {"cat", e.cat}, {"ph", std::string(1, e.ph)},
                      {"ts", e.ts},     {"pid", pid},   {"tid", e.tid}};
  if (e.ph == 'X') j["dur"] = e.dur;
  if (e.ph == 'i') j["s"] = "t";  // an instant on its thread
  if (!e.args.is_null()) j["args"] = e.args;
  return j;
}

nlohmann::json metadata(const char* what, int pid, int tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

OverlapSummary overlap_summary(const std::vector<trace::Event>& events) {
  std::vector<Interval> comm, wait;
  for (const trace::Event& e : events) {
    if (e.ph != 'X') continue;
    if (e.tid == trace::kCommThread && e.cat == "comm") comm.emplace_back(e.ts, e.ts + e.dur);
    if (e.tid == trace::kComputeThread && e.cat == "wait") wait.emplace_back(e.ts, e.ts + e.dur);
  }
  comm = merge(std::move(comm));
  wait = merge(std::move(wait));
  OverlapSummary s;
  for (const Interval& c : comm) s.comm_us += c.second - c.first;
  // Intersection of two sorted unions, walked together.
  std::size_t i = 0, j = 0;
  while (i < comm.size() && j < wait.size()) {
    const double lo = std::max(comm[i].first, wait[j].first), hi = std::min(comm[i].second, wait[j].second);
    if (hi > lo) s.exposed_us += hi - lo;
    if (comm[i].second < wait[j].second)
      ++i;
    else
      ++j;
  }
  return s;
}

void write_trace(const std::string& path, Communicator& comm, const std::vector<trace::Event>& events) {
  const int rank = comm.rank(), n = comm.world_size();
  nlohmann::json mine = nlohmann::json::array();
  mine.push_back(metadata("process_name", rank, 0, "rank " + std::to_string(rank)));
  mine.push_back(metadata("thread_name", rank, trace::kComputeThread, "compute"));
  mine.push_back(metadata("thread_name", rank, trace::kCommThread, "communication"));
  for (const trace::Event& e : events) mine.push_back(to_json(e, rank));
  std::string text = mine.dump();

  // Gather the texts: lengths through exact double sums, bytes through an all-gather of 4-byte words
  // (the all-gather copies bytes; nothing is added).
  const Ledger saved = comm.ledger();
  std::vector<std::size_t> words(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    words[static_cast<std::size_t>(r)] =
        static_cast<std::size_t>(comm.all_reduce_sum(r == rank ? static_cast<double>(text.size()) : 0.0));
  std::vector<std::size_t> bytes = words;
  for (std::size_t& w : words) w = (w + 3) / 4;
  std::size_t total = 0, offset = 0;
  for (int r = 0; r < n; ++r) {
    if (r < rank) offset += words[static_cast<std::size_t>(r)];
    total += words[static_cast<std::size_t>(r)];
  }
  std::vector<float> gathered(std::max<std::size_t>(total, 1));
  std::memcpy(gathered.data() + offset, text.data(), text.size());
  comm.all_gather(gathered.data() + offset, gathered.data(), words, DType::f32);
  comm.ledger() = saved;
  if (rank != 0) return;

  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  const char* base = reinterpret_cast<const char*>(gathered.data());
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const std::string part(base + at * 4, bytes[static_cast<std::size_t>(r)]);  // "[...]"
    if (part.size() > 2) {
      if (out.back() != '[') out += ",";
      out.append(part, 1, part.size() - 2);
    }
    at += words[static_cast<std::size_t>(r)];
  }
  out += "]}\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    ZERO_CHECK(f.good(), "--trace: cannot write '{}'", path);
    f << out;
    ZERO_CHECK(f.good(), "--trace: error while writing '{}'", path);
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace zero::dist
