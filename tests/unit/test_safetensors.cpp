// safetensors reader/writer against bytes laid out by hand from the public format description, CRC-32
// against the standard check value, and the state round trips checkpoints rely on (Generator,
// LossScaler).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/safetensors.h"
#include "distributed/run/checkpoint.h"
#include "optim/loss_scaler.h"

namespace {

namespace fs = std::filesystem;
namespace st = zero::safetensors;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zero_st_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A file from a header text and data bytes, framed by hand: 8-byte little-endian length, header, data.
  std::string raw(const std::string& name, const std::string& header, const std::string& data) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes << header << data;
    return path;
  }
  // Opening `path` throws zero::Error whose message holds `what`.
  static void expect_refused(const std::string& path, const std::string& what) {
    try {
      st::Reader r(path);
      ADD_FAILURE() << "accepted " << path;
    } catch (const zero::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  static std::string floats(std::initializer_list<float> v) {
    std::string out(v.size() * 4, '\0');
    std::memcpy(out.data(), std::data(v), out.size());  // the machines here are little-endian, like the format
    return out;
  }
  fs::path dir_;
};

TEST(Crc32, StandardCheckValue) {
  EXPECT_EQ(st::crc32("123456789", 9), 0xCBF43926u);  // the CRC-32/ISO-HDLC check value
  EXPECT_EQ(st::crc32("", 0), 0u);
  // Streaming in pieces equals one call, across the 8-byte fast path.
  const std::string s = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(st::crc32(s.data(), s.size()), 0x414FA339u);
  EXPECT_EQ(st::crc32(s.data() + 13, s.size() - 13, st::crc32(s.data(), 13)), 0x414FA339u);
}

TEST_F(Safetensors, ReadsAHandWrittenFile) {
  const std::string path = raw("a.safetensors",
                               R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]},)"
                               R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})",
                               floats({1.5f, -2.0f, 3.0f, 4.0f, 5.25f}));
  const st::Reader r(path);
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.tensors()[0].name, "a");  // data order
  EXPECT_EQ(r.tensors()[1].shape, (zero::Shape{3}));
  EXPECT_EQ(r.metadata().at("k"), "v");
  float b[2];
  r.read_f32(*r.find("b"), 1, 2, b);
  EXPECT_EQ(b[0], 4.0f);
  EXPECT_EQ(b[1], 5.25f);
}

TEST_F(Safetensors, WriterLaysOutTheFormat) {
  const std::vector<float> x{1, 2, 3, 4, 5, 6}, y{7};
  const std::string path = (dir_ / "w.safetensors").string();
  st::write_f32_file(path, {"x", "y"}, {{2, 3}, {1}}, {x.data(), y.data()}, {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  const auto h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["x"]["dtype"], "F32");
  EXPECT_EQ(h["x"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(h["x"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(h["y"]["data_offsets"], nlohmann::json({24, 28}));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  ASSERT_EQ(bytes.size(), 8 + n + 28);
  float got[7];
  std::memcpy(got, bytes.data() + 8 + n, 28);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], x[static_cast<std::size_t>(i)]);
  EXPECT_EQ(got[6], 7.0f);
}

TEST_F(Safetensors, RejectsMalformedFiles) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data = floats({1, 2});
  expect_refused(raw("truncated", ok, data.substr(0, 7)), "truncated");
  expect_refused(raw("trailing", ok, data + "x"), "trailing");
  expect_refused(raw("json", "{\"a\":", data), "not valid JSON");
  expect_refused(raw("dtype", R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", data), "unsupported dtype");
  expect_refused(raw("size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "do not hold");
  expect_refused(raw("overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "gap or overlap");
  {
    const std::string path = (dir_ / "short").string();
    std::ofstream(path) << "abc";
    expect_refused(path, "shorter than");
  }
  expect_refused((dir_ / "absent").string(), "cannot open");
}

// Note [Bounded header] in core/safetensors.cpp: a nesting deeper than the format has is refused while
// the header streams in, before it is parsed (the timing and memory are measured in the issue note,
// not asserted: a timed test would be flaky), shapes whose byte size overflows 64 bits are refused
// rather than wrapped, and a string holding brackets does not count as nesting.
TEST_F(Safetensors, BoundsHeaderDepthAndShapeOverflow) {
  const std::string data = floats({1, 2});
  // 9 levels: one past the limit of 8 (a real header nests 3 deep).
  expect_refused(raw("deep", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[[[[[[[1]]]]]]}})", data),
        "nests deeper than 8 levels");
  // 8 levels, and brackets inside strings (escaped quote included), parse to the same file.
  const st::Reader eight(raw("eight", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("__metadata__":{"k":"[[[[[[[[[\"{{{{{{{{{"}})",
                                      data));
  EXPECT_EQ(eight.metadata().at("k"), "[[[[[[[[[\"{{{{{{{{{");
  // 2^62 elements of 4 bytes: 2^64 bytes, which wraps to 0 in 64 bits.
  expect_refused(raw("wrap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[8,8]}})", data),
        "tensor 'b' has shape [4611686018427387904] whose size in bytes overflows 64 bits");
  // A product of dimensions that overflows, each dimension fine on its own.
  expect_refused(raw("product", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F16","shape":[4294967296,4294967296],"data_offsets":[8,8]}})", data),
        "overflows 64 bits");
  // A dimension beyond int64 (2^63).
  expect_refused(raw("dim", R"({"a":{"dtype":"F32","shape":[9223372036854775808, 0],"data_offsets":[0,0]}})", ""),
        "overflows 64 bits");
}

TEST(CheckpointState, GeneratorStateRoundTrip) {
  zero::Generator g(42);
  for (int i = 0; i < 7; ++i) g.uniform();
  const std::string s = zero::dist::generator_state(g);
  std::vector<float> first;
  for (int i = 0; i < 5; ++i) first.push_back(g.normal(0, 1));
  zero::Generator h(1);
  zero::dist::set_generator_state(h, s);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.normal(0, 1), first[static_cast<std::size_t>(i)]);
  EXPECT_THROW(zero::dist::set_generator_state(h, "not a state"), zero::Error);
}

TEST(CheckpointState, LossScalerStateRoundTrip) {
  zero::optim::LossScalerConfig cfg;
  cfg.loss_scale_window = 2;
  cfg.hysteresis = 3;
  zero::optim::LossScaler a(cfg), b(cfg);
  for (bool overflow : {true, false, true, false, false, false}) a.update(overflow);
  b.set_state(a.state());
  for (bool overflow : {true, true, false, false, false, true, false}) {
    a.update(overflow);
    b.update(overflow);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.hysteresis_left(), b.hysteresis_left());
  }
  EXPECT_THROW(b.set_state({0.0f, 1, 0, -1}), zero::Error);
  EXPECT_THROW(b.set_state({1.0f, 4, 0, -1}), zero::Error);
}

}  // namespace
