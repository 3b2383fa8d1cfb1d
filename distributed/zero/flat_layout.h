// FlatLayout: where every trainable parameter lives in one flat buffer, which rank owns which part of
// it, and how the buffer is cut into reduction buckets. Pure range arithmetic: no tensors, no ranks
// talking, so every rank computes the same map from the same parameter list.
//
//   flat buffer (padded_numel elements, one dtype):
//   | p0 | p1      | p2 |  p3                  |pad|
//   |<- partition 0 ->|<- partition 1 ->|<- partition 2 ->|     partition_size P = padded_numel / N
//
// Parameters are laid out back to back in the order given (named_parameters() order); zero-element
// parameters occupy no space. The total is padded with zeros up to a multiple of 2·world_size
// (DeepSpeed's nccl_start_alignment_factor × dp), and rank r's partition is [r·P, (r+1)·P):
//   - the N partitions are equal, so a reduce-scatter / all-gather of the whole buffer moves the same
//     count per rank;
//   - P is even, so for 16-bit dtypes every partition starts on a 4-byte boundary (what NCCL and
//     vectorised kernels want for the pointer they are handed).
// Entries that must stay whole in one partition (Muon's matrices) move the boundaries that would cut
// them to the matrix's edge instead, so partitions then differ in size (Note [Whole-matrix partitions]
// in flat_layout.cpp); every boundary stays even.
// A parameter may straddle partitions (even span several); the map lists, per parameter, the slice
// each rank owns, and per rank, its owned slices in flat order with their weight-decay flag. A model
// smaller than world_size leaves some partitions holding only padding (or nothing); they own no slices
// and everything still works (they reduce and gather zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zero::dist {

/// One contiguous piece of one parameter, owned by one rank.
struct ParamSlice {
  int rank = 0;                   // the owning rank
  std::size_t param = 0;          // index into FlatLayout::params()
  std::int64_t flat_offset = 0;   // where the piece starts in the flat buffer (elements)
  std::int64_t param_offset = 0;  // where it starts inside the parameter (row-major elements)
  std::int64_t length = 0;        // elements, > 0
  bool decay = true;              // AdamW weight decay applies to this piece (the parameter's flag)
};

/// One parameter's place in the flat buffer.
struct ParamRange {
  std::string name;
  Shape shape;
  std::int64_t numel = 0;
  std::int64_t offset = 0;  // first element in the flat buffer
  std::int64_t logical_offset = 0;  // first element in the logical range [0, Ψ), where parameters lie back to
                                    // back without gaps at every world size (Note [Logical positions])
  bool decay = true;
  std::vector<ParamSlice> slices;  // owner pieces in rank order; they tile [offset, offset + numel)
  std::int64_t end() const { return offset + numel; }
};

/// Real elements whose flat and logical positions both advance by one per element (Note [Logical positions]
/// in flat_layout.cpp): flat [flat, flat + length) holds logical [logical, logical + length).
struct FlatRun {
  std::int64_t flat = 0;     // first element in the flat buffer
  std::int64_t logical = 0;  // its position in the logical range [0, Ψ)
  std::int64_t length = 0;   // elements, > 0
};

/// A reduction bucket: a fixed range [begin, end) of the flat buffer. See Note [Bucket order] in
/// distributed/zero/gradient_reducer.cpp.
struct Bucket {
  int index = 0;                    // issue order: bucket 0 holds the END of the flat buffer
  std::int64_t begin = 0, end = 0;  // flat elements
  std::vector<std::size_t> counts;  // per rank: elements of the bucket inside that rank's partition
                                    // (the reduce-scatter counts; they sum to end - begin)
  std::vector<std::size_t> params;  // indices of the non-empty parameters overlapping the bucket
  std::int64_t size() const { return end - begin; }
};

/// Address of element `element` of contiguous `t` (any dtype): the raw pointer a collective is handed.
char* element_ptr(const Tensor& t, std::int64_t element);
/// A 1-D view of elements [begin, begin + n) of contiguous `t` (a range of a flat buffer; no copy).
Tensor flat_range(const Tensor& t, std::int64_t begin, std::int64_t n);

class FlatLayout {
 public:
  /// What the layout needs to know about one parameter.
  struct Entry {
    std::string name;
    Shape shape;
    bool decay = true;
    bool whole = false;  // keep it inside one partition (Note [Whole-matrix partitions] in flat_layout.cpp)
  };

  FlatLayout() = default;
  /// Lays out `entries` in order for `world_size` ranks. A boundary r·P that would cut an entry marked
  /// `whole` moves to that entry's start or end, whichever is nearer, and a whole entry starts on an even
  /// position (at most one element of padding before it) so that every boundary stays even (Note
  /// [Whole-matrix partitions] in flat_layout.cpp). Throws zero::Error if world_size < 1 or a shape has a
  /// negative dimension.
  FlatLayout(const std::vector<Entry>& entries, int world_size);

  int world_size() const { return world_size_; }
  /// Ψ: real (unpadded) elements.
  std::int64_t numel() const { return numel_; }
  /// Ψ plus the padding: the end's, up to a multiple of alignment(), and with whole entries (Muon
  /// matrices) the single elements that start each on an even position. Elements.
  std::int64_t padded_numel() const { return padded_; }
  std::int64_t padding() const { return padded_ - numel_; }
  /// Padding between parameters (the elements that start `whole` entries on even positions); 0 without
  /// such entries. Elements.
  std::int64_t interior_padding() const { return interior_padding_; }
  /// 2·world_size: the total is a multiple of it (see the header comment).
  std::int64_t alignment() const { return 2 * static_cast<std::int64_t>(world_size_); }
  /// Rank `rank`'s partition [partition_begin, partition_end) of the flat buffer, in elements: [r·P,
  /// (r+1)·P) with P = padded_numel / world_size, unless whole entries moved its boundaries. Both ends
  /// are even; the partitions tile [0, padded_numel) in rank order. Throws zero::Error for a rank
  /// outside [0, world_size).
  std::int64_t partition_begin(int rank) const;
  std::int64_t partition_end(int rank) const;
  std::int64_t partition_size(int rank) const { return partition_end(rank) - partition_begin(rank); }
  /// The rank with the largest partition (the lowest such rank): what a per-partition buffer costs on
  /// the rank that holds the most.
  int largest_partition() const;
  /// Its partition_size: padded_numel / world_size without whole entries. Elements.
  std::int64_t largest_partition_size() const { return partition_size(largest_partition()); }
  /// Real (non-padding) elements inside rank's partition.
  std::int64_t partition_real_numel(int rank) const;

  const std::vector<ParamRange>& params() const { return params_; }
  /// Slices rank `rank` owns, in flat order. Empty for a partition of padding only.
  const std::vector<ParamSlice>& owned(int rank) const;

  /// The rank owning flat element `flat_offset` (in [0, padded_numel)).
  int owner_of(std::int64_t flat_offset) const;

  /// The logical position of flat position `flat` (in [0, padded_numel]): the number of real elements
  /// before it, so a real element's index in [0, Ψ) with the parameters back to back, padding's the next
  /// real element's, and padded_numel's Ψ. min(flat, Ψ) for a layout without gaps. Note [Logical
  /// positions] in flat_layout.cpp. Throws zero::Error for a position outside [0, padded_numel].
  std::int64_t to_logical(std::int64_t flat) const;
  /// The real elements of the flat range [begin, end) as maximal runs, in flat order; their logical
  /// ranges tile [to_logical(begin), to_logical(end)) in order (one run without gaps between parameters,
  /// none for padding only). Throws zero::Error for a range outside [0, padded_numel].
  std::vector<FlatRun> logical_runs(std::int64_t begin, std::int64_t end) const;

  /// Cuts the flat buffer into fixed buckets of `bucket_size` elements counted from its END: bucket k
  /// is [max(0, padded - (k+1)·bucket_size), padded - k·bucket_size), so only the last-numbered one
  /// (at the start of the buffer) may be short. Throws zero::Error if bucket_size < 1.
  std::vector<Bucket> make_buckets(std::int64_t bucket_size) const;

  /// Per-rank counts of the flat range [begin, end) split at partition boundaries (each rank's
  /// overlap with the range, in elements). The counts of a reduce-scatter or all-gather whose buffer
  /// is that range.
  std::vector<std::size_t> range_counts(std::int64_t begin, std::int64_t end) const;

 private:
  int world_size_ = 1;
  std::int64_t numel_ = 0;
  std::int64_t padded_ = 0;
  std::int64_t interior_padding_ = 0;
  std::vector<std::int64_t> bounds_;  // world_size + 1 partition boundaries: rank r's is [bounds_[r], bounds_[r + 1])
  std::vector<ParamRange> params_;
  std::vector<std::vector<ParamSlice>> owned_;  // per rank
};

}  // namespace zero::dist
