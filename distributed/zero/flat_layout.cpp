#include "distributed/zero/flat_layout.h"

#include <algorithm>

#include "core/check.h"

namespace zero::dist {

char* element_ptr(const Tensor& t, std::int64_t element) {
  return static_cast<char*>(t.raw_data()) + element * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

Tensor flat_range(const Tensor& t, std::int64_t begin, std::int64_t n) {
  return t.as_strided({n}, {1}, t.offset() + begin);
}

// Note [Whole-matrix partitions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An element partition cuts a parameter wherever a partition boundary falls, which is all an
// elementwise optimizer (AdamW) needs. A matrix optimizer (Muon's Newton–Schulz iteration) needs the
// whole matrix's gradient in one place. Entries marked `whole` are therefore kept inside one partition by
// moving the boundaries, not the entries:
//   - the layout stays back to back in the given order, except that a whole entry starts on an even
//     position (one element of padding before it when the parameters before it end on an odd one);
//   - a boundary r·P that falls inside a whole entry moves to the entry's start or its end (rounded up
//     to even), whichever is nearer. Boundaries stay even and in order, and a boundary between entries
//     stays where it was.
// Each boundary moves by at most half a matrix, so a partition differs from P by at most the largest
// matrix. Every reduce-scatter and all-gather already takes per-rank counts (a bucket's or a gather
// unit's overlap with each partition, FlatLayout::range_counts), so a step moves the bytes of AdamW's
// layout plus those of the gaps: at most one element per matrix, and the rounding of the total up to a
// multiple of 2N that they may tip over (none with even widths, as in the default model). Keeping the
// partitions equal instead would mean moving each cut matrix to the next partition and filling the hole
// with padding, which every collective would carry. What uneven partitions cost is memory: each
// per-partition buffer is as large as its rank's partition, so the largest sets the peak
// (largest_partition_size; zero_explain prints the imbalance). On more ranks than Ψ / (largest matrix)
// some partitions hold a whole matrix and others nothing. The order is kept so that stage 3's gather
// units stay contiguous and buckets still fill in backward order; the owner of a matrix follows from
// where it falls, so per-rank Newton–Schulz work is not balanced (zero_explain reports the imbalance).

// Note [Logical positions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The flat buffer's positions can differ from the parameters' back-to-back positions once a layout has
// gaps (the single elements that start whole entries on even positions, Note [Whole-matrix partitions]). The logical range [0, Ψ) does
// not: the parameters back to back in the given order, parameter i at the sum of the sizes before it
// (ParamRange::logical_offset). Since the layout keeps the order and only inserts padding, flat and
// logical positions of real elements increase together, so
//   - the real elements of any flat range, rank r's partition in particular, are ONE
//     contiguous logical range [to_logical(begin), to_logical(end)), held in the flat buffer as a few runs
//     split by the gaps (logical_runs; a layout without gaps has one run);
//   - the partitions' logical ranges tile [0, Ψ) in rank order, at every world size.
// This is what lets a checkpoint describe a run with gaps in the same world-size-independent ranges as
// one without (Note [Checkpoint ranges] in distributed/run/checkpoint.cpp): a saving rank compacts its
// runs into its logical range, a loading rank scatters the logical range it needs into its runs, and
// the gaps, padding like the end's, are never stored. Without gaps to_logical(x) = min(x, Ψ), so every
// logical range equals the flat range cut at Ψ.

namespace {

// Offsets of `numels` laid out in order, back to back except that `whole[i]` entries start on even
// positions. Returns the end of the last entry.
std::int64_t place(const std::vector<std::int64_t>& numels, const std::vector<char>& whole,
                   std::vector<std::int64_t>& offsets) {
  std::int64_t offset = 0;
  offsets.resize(numels.size());
  for (std::size_t i = 0; i < numels.size(); ++i) {
    if (whole[i] && numels[i] > 0) offset += offset % 2;
    offsets[i] = offset;
    offset += numels[i];
  }
  return offset;
}

// `boundary` moved out of any whole entry that holds it strictly inside: to the entry's start or its end
// rounded up to even, whichever is nearer (the start on a tie). Note [Whole-matrix partitions].
std::int64_t outside_whole(std::int64_t boundary, const std::vector<std::int64_t>& numels,
                           const std::vector<char>& whole, const std::vector<std::int64_t>& offsets) {
  for (std::size_t i = 0; i < numels.size(); ++i) {
    const std::int64_t start = offsets[i], end = offsets[i] + numels[i];
    if (!whole[i] || boundary <= start || boundary >= end) continue;
    const std::int64_t after = end + end % 2;
    return boundary - start <= after - boundary ? start : after;
  }
  return boundary;
}

}  // namespace

FlatLayout::FlatLayout(const std::vector<Entry>& entries, int world_size) : world_size_(world_size) {
  ZERO_CHECK(world_size >= 1, "FlatLayout: world_size must be >= 1, got {}", world_size);
  std::vector<std::int64_t> numels;
  std::vector<char> whole;
  for (const Entry& e : entries) {
    for (auto d : e.shape)
      ZERO_CHECK(d >= 0, "FlatLayout: parameter '{}' has a negative dimension in shape {}", e.name, shape_str(e.shape));
    numels.push_back(shape_numel(e.shape));
    whole.push_back(e.whole && world_size > 1);
  }
  for (std::int64_t n : numels) numel_ += n;
  std::vector<std::int64_t> offsets;
  const std::int64_t end = place(numels, whole, offsets);
  interior_padding_ = end - numel_;
  const std::int64_t align = alignment();
  padded_ = (end + align - 1) / align * align;
  const std::int64_t P = padded_ / world_size_;
  bounds_.resize(static_cast<std::size_t>(world_size_) + 1);
  for (int r = 0; r <= world_size_; ++r)
    bounds_[static_cast<std::size_t>(r)] = outside_whole(r * P, numels, whole, offsets);
  params_.reserve(entries.size());
  std::int64_t logical = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    ParamRange p;
    p.name = entries[i].name;
    p.shape = entries[i].shape;
    p.numel = numels[i];
    p.offset = offsets[i];
    p.logical_offset = logical;
    logical += numels[i];
    p.decay = entries[i].decay;
    params_.push_back(std::move(p));
  }

  // Cut every parameter at partition boundaries. Walking parameters in flat order and, inside one,
  // ranks in increasing order, appends each rank's slices in flat order.
  owned_.assign(static_cast<std::size_t>(world_size_), {});
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ParamRange& p = params_[i];
    std::int64_t pos = p.offset;
    while (pos < p.end()) {
      const int r = owner_of(pos);
      const std::int64_t stop = std::min(p.end(), partition_end(r));
      ParamSlice s{r, i, pos, pos - p.offset, stop - pos, p.decay};
      p.slices.push_back(s);
      owned_[static_cast<std::size_t>(r)].push_back(s);
      pos = stop;
    }
  }
}

std::int64_t FlatLayout::partition_begin(int rank) const {
  ZERO_CHECK(rank >= 0 && rank < world_size_, "FlatLayout: rank {} out of range [0, {})", rank, world_size_);
  return bounds_[static_cast<std::size_t>(rank)];
}

std::int64_t FlatLayout::partition_end(int rank) const {
  ZERO_CHECK(rank >= 0 && rank < world_size_, "FlatLayout: rank {} out of range [0, {})", rank, world_size_);
  return bounds_[static_cast<std::size_t>(rank) + 1];
}

int FlatLayout::largest_partition() const {
  int largest = 0;
  for (int r = 1; r < world_size_; ++r)
    if (partition_size(r) > partition_size(largest)) largest = r;
  return largest;
}

std::int64_t FlatLayout::partition_real_numel(int rank) const {
  ZERO_CHECK(rank >= 0 && rank < world_size_, "FlatLayout: rank {} out of range [0, {})", rank, world_size_);
  std::int64_t real = 0;
  for (const ParamSlice& s : owned_[static_cast<std::size_t>(rank)]) real += s.length;
  return real;
}

const std::vector<ParamSlice>& FlatLayout::owned(int rank) const {
  ZERO_CHECK(rank >= 0 && rank < world_size_, "FlatLayout: rank {} out of range [0, {})", rank, world_size_);
  return owned_[static_cast<std::size_t>(rank)];
}

int FlatLayout::owner_of(std::int64_t flat_offset) const {
  ZERO_CHECK(flat_offset >= 0 && flat_offset < padded_, "FlatLayout: flat offset {} outside [0, {})", flat_offset,
             padded_);
  // The rank whose [begin, end) holds it: the first whose end lies beyond it (empty partitions hold nothing).
  const auto end = std::upper_bound(bounds_.begin() + 1, bounds_.end(), flat_offset);
  return static_cast<int>(end - (bounds_.begin() + 1));
}

std::int64_t FlatLayout::to_logical(std::int64_t flat) const {
  ZERO_CHECK(flat >= 0 && flat <= padded_, "FlatLayout: flat position {} outside [0, {}]", flat, padded_);
  // The last parameter starting at or before `flat` (offsets never decrease: the order is kept).
  const auto after = std::upper_bound(params_.begin(), params_.end(), flat,
                                      [](std::int64_t f, const ParamRange& p) { return f < p.offset; });
  if (after == params_.begin()) return 0;
  const ParamRange& p = *(after - 1);
  return p.logical_offset + std::min(flat - p.offset, p.numel);
}

std::vector<FlatRun> FlatLayout::logical_runs(std::int64_t begin, std::int64_t end) const {
  ZERO_CHECK(0 <= begin && begin <= end && end <= padded_, "FlatLayout: range [{}, {}) outside [0, {}]", begin, end,
             padded_);
  std::vector<FlatRun> runs;
  auto it = std::upper_bound(params_.begin(), params_.end(), begin,
                             [](std::int64_t f, const ParamRange& p) { return f < p.offset; });
  if (it != params_.begin()) --it;  // the parameter holding `begin`, if any, starts before it
  for (; it != params_.end() && it->offset < end; ++it) {
    const std::int64_t lo = std::max(begin, it->offset), hi = std::min(end, it->end());
    if (hi <= lo) continue;
    const std::int64_t logical = it->logical_offset + (lo - it->offset);
    if (!runs.empty() && runs.back().flat + runs.back().length == lo &&
        runs.back().logical + runs.back().length == logical) {
      runs.back().length += hi - lo;  // back to back in both coordinates: one run
    } else {
      runs.push_back({lo, logical, hi - lo});
    }
  }
  return runs;
}

std::vector<std::size_t> FlatLayout::range_counts(std::int64_t begin, std::int64_t end) const {
  ZERO_CHECK(0 <= begin && begin <= end && end <= padded_, "FlatLayout: range [{}, {}) outside [0, {})", begin, end,
             padded_);
  std::vector<std::size_t> counts(static_cast<std::size_t>(world_size_), 0);
  for (int r = 0; r < world_size_; ++r) {
    const std::int64_t lo = std::max(begin, partition_begin(r));
    const std::int64_t hi = std::min(end, partition_end(r));
    if (hi > lo) counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(hi - lo);
  }
  return counts;
}

std::vector<Bucket> FlatLayout::make_buckets(std::int64_t bucket_size) const {
  ZERO_CHECK(bucket_size >= 1, "FlatLayout: bucket size must be >= 1 element, got {}", bucket_size);
  std::vector<Bucket> buckets;
  for (std::int64_t end = padded_; end > 0; end -= bucket_size) {
    Bucket b;
    b.index = static_cast<int>(buckets.size());
    b.end = end;
    b.begin = std::max<std::int64_t>(0, end - bucket_size);
    b.counts = range_counts(b.begin, b.end);
    buckets.push_back(std::move(b));
  }
  // Parameters overlapping each bucket. Buckets run backwards through the buffer, so bucket k covers
  // [padded - (k+1)·size, padded - k·size) and a parameter's buckets are a contiguous index range.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRange& p = params_[i];
    if (p.numel == 0) continue;
    const std::int64_t first = (padded_ - p.end()) / bucket_size;      // holds p's last element
    const std::int64_t last = (padded_ - 1 - p.offset) / bucket_size;  // holds p's first element
    for (std::int64_t k = first; k <= last; ++k) buckets[static_cast<std::size_t>(k)].params.push_back(i);
  }
  return buckets;
}

}  // namespace zero::dist
