#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "core/check.h"

namespace zero::safetensors {

namespace {

constexpr std::uint64_t kMaxHeader = 100'000'000;  // the safetensors reference implementation's limit
constexpr int kMaxDepth = 8;  // a safetensors header nests 3 deep (header, entry, shape); Note [Bounded header]
constexpr std::size_t kScanChunk = 1 << 16;  // header bytes scanned at a time before any is kept

// Note [Bounded header]
// ~~~~~~~~~~~~~~~~~~~~~
// The header is untrusted input of up to kMaxHeader bytes. A parser that builds a document first and
// judges it afterwards pays for whatever the file holds: 100 MB of "[[[[..." becomes tens of millions
// of nested arrays (seconds, gigabytes) before anything is refused. So the reader first streams the
// header through DepthScan in kScanChunk pieces, keeping nothing, and refuses a nesting deeper than
// kMaxDepth at the first byte past it: a malformed header costs one chunk of memory and the time to
// reach its first offending byte. Only a header that passes is read whole and parsed. Every size that
// follows from it (shape product, times the element size, data offsets) is checked for 64-bit
// overflow before it is used.

// Nesting depth of JSON text fed piece by piece: brackets outside strings (escapes honoured).
struct DepthScan {
  int depth = 0;
  bool in_string = false, escaped = false;
  // Feeds n bytes; returns the offset of the first byte that nests deeper than max_depth, or n.
  std::size_t feed(const char* p, std::size_t n, int max_depth) {
    for (std::size_t i = 0; i < n; ++i) {
      const char c = p[i];
      if (in_string) {
        if (escaped)
          escaped = false;
        else if (c == '\\')
          escaped = true;
        else if (c == '"')
          in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        if (++depth > max_depth) return i;
      } else if (c == '}' || c == ']') {
        --depth;
      }
    }
    return n;
  }
};

// a * b, or nothing when it does not fit in 64 bits.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

struct DTypeCode {
  const char* code;
  DType dtype;
};
constexpr std::array<DTypeCode, 5> kCodes{{{"F32", DType::f32},
                                           {"F16", DType::f16},
                                           {"BF16", DType::bf16},
                                           {"I32", DType::i32},
                                           {"I64", DType::i64}}};

std::string errno_text() { return std::strerror(errno); }

// Slicing-by-8 tables for the reflected polynomial 0xEDB88320 (Sarwate's table method, widened to
// eight bytes per step as in Intel's "slicing-by-8" paper, Kounavis & Berry 2005).
struct CrcTables {
  std::uint32_t t[8][256];
  CrcTables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
const CrcTables& crc_tables() {
  static const CrcTables tables;
  return tables;
}

}  // namespace

std::string dtype_code(DType dtype) {
  for (const DTypeCode& c : kCodes)
    if (c.dtype == dtype) return c.code;
  throw Error(fmt::format("safetensors: no dtype code for {}", dtype_name(dtype)));
}

std::string encode_header(std::vector<TensorInfo>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (TensorInfo& t : tensors) {
    ZERO_CHECK(!t.name.empty() && t.name.rfind("__", 0) != 0, "safetensors: invalid tensor name '{}'", t.name);
    ZERO_CHECK(!h.contains(t.name), "safetensors: tensor '{}' listed twice", t.name);
    t.begin = offset;
    t.end = offset + static_cast<std::uint64_t>(t.numel()) * dtype_size(t.dtype);
    offset = t.end;
    h[t.name] = {{"dtype", dtype_code(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

namespace {

// The header's JSON text of the open file `fd` (`size` bytes): its length checked against the file
// and kMaxHeader, its nesting depth bounded (Note [Bounded header]) before any of it is kept.
std::string read_header_text(int fd, const std::string& path, std::uint64_t size) {
  ZERO_CHECK(size >= 8, "'{}' is not a safetensors file: {} bytes, shorter than the 8-byte header length", path,
             size);
  unsigned char len_bytes[8];
  io::pread_all(fd, len_bytes, 8, 0, path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  ZERO_CHECK(n <= kMaxHeader && n <= size - 8, "'{}' is truncated or not a safetensors file: header length {} with "
             "{} bytes in the file", path, n, size);
  DepthScan scan;
  std::vector<char> chunk(static_cast<std::size_t>(std::min<std::uint64_t>(n, kScanChunk)));
  for (std::uint64_t done = 0; done < n;) {
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(n - done, kScanChunk));
    io::pread_all(fd, chunk.data(), len, 8 + done, path);
    const std::size_t at = scan.feed(chunk.data(), len, kMaxDepth);
    ZERO_CHECK(at == len, "'{}': the safetensors header nests deeper than {} levels (at byte {} of {}); not a "
               "safetensors file", path, kMaxDepth, done + at, n);
    done += len;
  }
  std::string text(static_cast<std::size_t>(n), '\0');
  io::pread_all(fd, text.data(), text.size(), 8, path);
  return text;
}

// One tensor's header entry: dtype, shape and data offsets, each checked (sizes for 64-bit overflow).
TensorInfo parse_tensor_entry(const std::string& path, const std::string& name, const nlohmann::json& e) {
  ZERO_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
             "'{}': tensor '{}' lacks dtype, shape or data_offsets", path, name);
  TensorInfo t;
  t.name = name;
  const auto& code = e["dtype"];
  ZERO_CHECK(code.is_string(), "'{}': tensor '{}' has a non-string dtype", path, name);
  bool known = false;
  for (const DTypeCode& c : kCodes)
    if (code.get<std::string>() == c.code) {
      t.dtype = c.dtype;
      known = true;
    }
  ZERO_CHECK(known, "'{}': tensor '{}' has unsupported dtype {}", path, name, code.dump());
  ZERO_CHECK(e["shape"].is_array(), "'{}': tensor '{}' shape is not a list", path, name);
  // Element count and byte size, each product checked for 64-bit overflow (Note [Bounded header]).
  std::optional<std::uint64_t> bytes = dtype_size(t.dtype);
  for (const auto& d : e["shape"]) {
    ZERO_CHECK(d.is_number_unsigned(), "'{}': tensor '{}' has a bad dimension {}", path, name, d.dump());
    const auto dim = d.get<std::uint64_t>();
    bytes = bytes ? checked_mul(*bytes, dim) : bytes;
    ZERO_CHECK(dim <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) && bytes,
               "'{}': tensor '{}' has shape {} whose size in bytes overflows 64 bits", path, name, e["shape"].dump());
    t.shape.push_back(static_cast<std::int64_t>(dim));
  }
  const auto& off = e["data_offsets"];
  ZERO_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
             "'{}': tensor '{}' data_offsets is not [begin, end]", path, name);
  t.begin = off[0].get<std::uint64_t>();
  t.end = off[1].get<std::uint64_t>();
  ZERO_CHECK(t.end >= t.begin && t.end - t.begin == *bytes,
             "'{}': tensor '{}' data_offsets [{}, {}] do not hold its {} bytes", path, name, t.begin, t.end, *bytes);
  return t;
}

// Sorts the tensors by offset and checks that they tile the data section; returns its size in bytes.
std::uint64_t sort_and_check_tiling(const std::string& path, std::vector<TensorInfo>& tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expect = 0;
  for (const TensorInfo& t : tensors) {
    ZERO_CHECK(t.begin == expect, "'{}': tensor '{}' starts at byte {} of the data, expected {} (gap or overlap)",
               path, t.name, t.begin, expect);
    expect = t.end;
  }
  return expect;
}

}  // namespace

Reader::Reader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd_ >= 0, "cannot open '{}': {}", path, errno_text());
  try {
    struct stat st {};
    ZERO_CHECK(::fstat(fd_, &st) == 0, "cannot stat '{}': {}", path, errno_text());
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const std::string text = read_header_text(fd_, path, size);
    nlohmann::json h;
    try {
      h = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("'{}' has a safetensors header that is not valid JSON", path));
    }
    ZERO_CHECK(h.is_object(), "'{}': the safetensors header is not a JSON object", path);
    data_start_ = 8 + text.size();
    for (const auto& [name, e] : h.items()) {
      if (name == "__metadata__") {
        ZERO_CHECK(e.is_object(), "'{}': __metadata__ is not an object", path);
        for (const auto& [k, v] : e.items()) {
          ZERO_CHECK(v.is_string(), "'{}': __metadata__ value of '{}' is not a string", path, k);
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      tensors_.push_back(parse_tensor_entry(path, name, e));
    }
    const std::uint64_t expect = sort_and_check_tiling(path, tensors_);
    data_size_ = expect;
    ZERO_CHECK(expect <= size - data_start_ && size == data_start_ + expect, "'{}' is truncated or has trailing bytes: {} bytes, the header says {}",
               path, size, data_start_ + expect);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* Reader::find(const std::string& name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void Reader::read_f32(const TensorInfo& t, std::int64_t first, std::int64_t n, float* dst) const {
  ZERO_CHECK(t.dtype == DType::f32, "'{}': tensor '{}' is {}, expected F32", path_, t.name, dtype_code(t.dtype));
  ZERO_CHECK(first >= 0 && n >= 0 && first + n <= t.numel(), "'{}': elements [{}, {}) are outside tensor '{}' ({})",
             path_, first, first + n, t.name, t.numel());
  if (n == 0) return;
  io::pread_all(fd_, dst, static_cast<std::size_t>(n) * sizeof(float),
                data_start_ + t.begin + static_cast<std::uint64_t>(first) * sizeof(float), path_);
}

void Reader::read_data(std::uint64_t offset, std::size_t n, void* dst) const {
  ZERO_CHECK(offset <= data_size_ && n <= data_size_ - offset, "'{}': bytes [{}, {}) are outside its {}-byte data",
             path_, offset, offset + n, data_size_);
  if (n > 0) io::pread_all(fd_, dst, n, data_start_ + offset, path_);
}

void write_f32_file(const std::string& path, const std::vector<std::string>& names, const std::vector<Shape>& shapes,
                    const std::vector<const float*>& data, const std::map<std::string, std::string>& metadata) {
  ZERO_CHECK(names.size() == shapes.size() && names.size() == data.size(),
             "write_f32_file: {} names, {} shapes, {} data pointers", names.size(), shapes.size(), data.size());
  std::vector<TensorInfo> tensors;
  for (std::size_t i = 0; i < names.size(); ++i) tensors.push_back({names[i], DType::f32, shapes[i], 0, 0});
  const std::string header = encode_header(tensors, metadata);
  const int fd = io::open_write(path, true);
  try {
    io::pwrite_all(fd, header.data(), header.size(), 0, path);
    for (std::size_t i = 0; i < tensors.size(); ++i)
      io::pwrite_all(fd, data[i], tensors[i].end - tensors[i].begin, header.size() + tensors[i].begin, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  io::sync_close(fd, path);
}

std::uint32_t crc32(const void* data, std::size_t n, std::uint32_t crc) {
  const auto& t = crc_tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  while (n >= 8) {
    // Little-endian words, byte by byte so alignment never matters.
    const std::uint32_t lo = c ^ (static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                                  static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24);
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
        t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

std::pair<std::uint32_t, std::uint64_t> file_crc32(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open '{}': {}", path, errno_text());
  std::vector<unsigned char> buf(1 << 20);
  std::uint32_t crc = 0;
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const std::string err = errno_text();
      ::close(fd);
      throw Error(fmt::format("cannot read '{}': {}", path, err));
    }
    if (got == 0) break;
    crc = crc32(buf.data(), static_cast<std::size_t>(got), crc);
    total += static_cast<std::uint64_t>(got);
  }
  ::close(fd);
  return {crc, total};
}

namespace io {

int open_write(const std::string& path, bool create) {
  const int flags = O_WRONLY | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  const int fd = ::open(path.c_str(), flags, 0644);
  ZERO_CHECK(fd >= 0, "cannot open '{}' for writing: {}", path, errno_text());
  return fd;
}

void pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (put < 0 && errno == EINTR) continue;
    ZERO_CHECK(put > 0, "cannot write '{}': {}", path, put < 0 ? errno_text() : std::string("no progress"));
    p += put;
    n -= static_cast<std::size_t>(put);
    offset += static_cast<std::uint64_t>(put);
  }
}

void pread_all(int fd, void* data, std::size_t n, std::uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    ZERO_CHECK(got >= 0, "cannot read '{}': {}", path, errno_text());
    ZERO_CHECK(got > 0, "'{}' is truncated: it ends before byte {}", path, offset + n);
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
}

void sync_close(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    const std::string err = errno_text();
    ::close(fd);
    throw Error(fmt::format("cannot flush '{}' to disk: {}", path, err));
  }
  ZERO_CHECK(::close(fd) == 0, "cannot close '{}': {}", path, errno_text());
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open directory '{}': {}", dir, errno_text());
  sync_close(fd, dir);
}

void write_text_synced(const std::string& path, const std::string& text) {
  const int fd = open_write(path, true);
  try {
    pwrite_all(fd, text.data(), text.size(), 0, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  sync_close(fd, path);
}

}  // namespace io

}  // namespace zero::safetensors
