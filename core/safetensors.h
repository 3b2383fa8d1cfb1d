// safetensors: the tensor file format of Hugging Face's safetensors project (public specification at
// https://huggingface.co/docs/safetensors), which PyTorch, NumPy and the safetensors tools read:
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, space-padded] [data: raw little-endian]
//   header = {"<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"<key>": "<string value>", ...}}   (metadata optional, strings only)
//
// data_offsets are BYTES relative to the start of the data section; the tensors tile it with no gaps
// or overlaps. Writers here lay tensors out back to back in the order given, so a file written from
// a list of parameters is their concatenation: element e of the concatenation sits at byte
// data_start + e·itemsize, which lets several processes fill one file at known offsets.
// Also here: CRC-32 (the zlib / IEEE 802.3 polynomial, as Python's zlib.crc32), for checksums, and
// small POSIX file helpers that report failures as zero::Error naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zero::safetensors {

/// One tensor of a file: name, dtype, shape, and its byte range [begin, end) in the data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
  std::int64_t numel() const { return shape_numel(shape); }
};

/// The safetensors dtype name ("F32", "F16", "BF16", "I64") of `dtype`. Throws for other dtypes.
std::string dtype_code(DType dtype);

/// The whole header block (8-byte length + JSON padded with spaces to a multiple of 8 bytes) for
/// `tensors` laid out back to back in the given order; their begin/end are filled in. Throws for a
/// duplicate or empty name or a name starting with "__".
std::string encode_header(std::vector<TensorInfo>& tensors, const std::map<std::string, std::string>& metadata);

/// A parsed, validated safetensors file, read by ranges with pread (no mapping, no full read).
class Reader {
 public:
  /// Opens and validates `path`: header length within the file and under 100 MB, nested at most 8
  /// deep (checked while streaming it, before it is parsed), JSON that parses, every entry with a known
  /// dtype, a shape whose size in bytes fits in 64 bits and data_offsets matching that size, entries
  /// tiling the data section exactly, and a file exactly as long as the header says. Throws
  /// zero::Error naming the file and the first problem (a truncated file is one).
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  /// Entries in data order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// The entry called `name`, or nullptr.
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Byte offset of the data section in the file.
  std::uint64_t data_start() const { return data_start_; }
  /// Copies elements [first, first + n) of F32 tensor `t` (row-major) into dst[n]. Throws if `t` is not
  /// F32 or the range is outside it, or on a read error.
  void read_f32(const TensorInfo& t, std::int64_t first, std::int64_t n, float* dst) const;
  /// Copies n bytes starting `offset` bytes into the data section (across tensor boundaries) into dst.
  /// Throws if the range is outside the data section, or on a read error.
  void read_data(std::uint64_t offset, std::size_t n, void* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_start_ = 0;
  std::uint64_t data_size_ = 0;
};

/// Writes a whole file of F32 tensors: names[i] with shapes[i] and data[i] (shape_numel floats each).
/// Not atomic (callers that need that write to a temporary name and rename). Throws on I/O errors.
void write_f32_file(const std::string& path, const std::vector<std::string>& names, const std::vector<Shape>& shapes,
                    const std::vector<const float*>& data, const std::map<std::string, std::string>& metadata = {});

/// CRC-32 (zlib's), continuing from `crc` (0 to start): crc32("123456789") == 0xCBF43926.
std::uint32_t crc32(const void* data, std::size_t n, std::uint32_t crc = 0);
/// CRC-32 and size in bytes of a whole file. Throws zero::Error naming the file if it cannot be read.
std::pair<std::uint32_t, std::uint64_t> file_crc32(const std::string& path);

// ---- POSIX helpers: each throws zero::Error naming the file and strerror on failure ----
namespace io {
/// open(2) for writing: create (truncating) or, with create = false, open an existing file.
int open_write(const std::string& path, bool create);
void pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t offset, const std::string& path);
void pread_all(int fd, void* data, std::size_t n, std::uint64_t offset, const std::string& path);
/// fsync(2) then close(2).
void sync_close(int fd, const std::string& path);
/// fsync(2) of a directory, so a rename or create inside it is durable.
void sync_dir(const std::string& dir);
/// Writes `text` to `path` and fsyncs it (not atomic by itself).
void write_text_synced(const std::string& path, const std::string& text);
}  // namespace io

}  // namespace zero::safetensors
