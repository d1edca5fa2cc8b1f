#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ppx/error.h"
#include "ppx/safetensors.h"
#include "test_util.h"

using namespace ppx;

namespace {

// Expects opening `path` to throw ppx::Error whose message contains every string in `needles`.
void expect_error(const std::string& path, std::initializer_list<std::string> needles) {
  try {
    SafeTensors st(path);
    FAIL() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg << " lacks " << n;
  }
}

std::vector<char> with_header(const std::string& header, size_t data_bytes) {
  std::vector<char> b(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

}  // namespace

TEST(SafeTensors, ReadsGoldenMimi) {
  SafeTensors st(test::data("mimi_tiny_a.safetensors"));
  const TensorInfo& ti = st.info("encoder.model.0.conv.conv.weight");
  EXPECT_EQ(ti.dtype, DType::kF32);
  EXPECT_EQ(ti.shape, (std::vector<int64_t>{8, 1, 7}));
  EXPECT_EQ(st.to_f32("encoder.model.0.conv.conv.weight").size(), 56u);
}

TEST(SafeTensors, RoundTripsAllDtypesItWrites) {
  const std::string path = test::scratch("roundtrip.safetensors");
  std::map<std::string, TensorBlob> t;
  t["a"] = blob_f32({2, 3}, {1, 2, 3, 4, 5, -6.5f});
  t["b"] = blob_bf16({3}, {1.0f, -2.0f, 1.00390625f /* exactly halfway: rounds to even 1.0 */});
  t["c"] = blob_i64({2}, {-1, 1ll << 40});
  t["empty"] = blob_f32({0, 4}, {});
  write_safetensors(path, t);
  SafeTensors st(path);
  EXPECT_EQ(st.to_f32("a"), (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
  EXPECT_EQ(st.to_f32("b"), (std::vector<float>{1.0f, -2.0f, 1.0f}));
  EXPECT_EQ(st.to_i64("c"), (std::vector<int64_t>{-1, 1ll << 40}));
  EXPECT_TRUE(st.to_f32("empty").empty());
  EXPECT_THROW(st.to_i64("a"), Error);
  EXPECT_THROW(st.to_f32("c"), Error);
  EXPECT_THROW(st.to_f32("a", {3, 2}), Error);
  EXPECT_THROW(st.info("nope"), Error);
}

TEST(SafeTensors, ConvertsHalfPrecision) {
  const std::string path = test::scratch("f16.safetensors");
  // fp16 1.0 = 0x3c00, -2.0 = 0xc000, smallest subnormal 0x0001 = 2^-24, +inf = 0x7c00.
  const std::string header = R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})";
  auto b = with_header(header, 8);
  const uint16_t v[4] = {0x3c00, 0xc000, 0x0001, 0x7c00};
  std::memcpy(b.data() + 8 + header.size(), v, 8);
  test::write_bytes(path, b);
  const auto f = SafeTensors(path).to_f32("h");
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_EQ(f[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f[3]));
}

TEST(SafeTensors, TruncatedGoldenNamesFileAndTensor) {
  const auto good = test::read_bytes(test::data("mimi_tiny_a.safetensors"));
  const std::string path = test::scratch("truncated.safetensors");
  auto cut = good;
  cut.resize(good.size() / 2);
  test::write_bytes(path, cut);
  expect_error(path, {path, "tensor '", "truncated"});
  cut.resize(100);  // inside the header
  test::write_bytes(path, cut);
  expect_error(path, {path, "header length"});
  cut.resize(3);
  test::write_bytes(path, cut);
  expect_error(path, {path, "too short"});
}

TEST(SafeTensors, CorruptHeadersAreRejected) {
  const std::string path = test::scratch("corrupt.safetensors");
  auto good = test::read_bytes(test::data("mimi_tiny_a.safetensors"));
  // Header length pointing far past the end.
  auto b = good;
  const uint64_t huge = 1ull << 62;
  std::memcpy(b.data(), &huge, 8);
  test::write_bytes(path, b);
  expect_error(path, {path, "header length"});
  // Garbage in the JSON.
  b = good;
  for (int i = 8; i < 40; ++i) b[i] = '\x7f';
  test::write_bytes(path, b);
  expect_error(path, {path, "JSON"});

  const struct { const char* header; const char* needle; } cases[] = {
      {R"([1,2])", "not a JSON object"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", "'t'"},           // size mismatch
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,1000]}})", "'t'"},         // past the end
      {R"({"t":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", "unsupported dtype"},
      {R"({"t":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "bad dimension"},
      {R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})", "overflow"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", "begin after"},
      {R"({"t":{"dtype":"F32","shape":[4]}})", "data_offsets"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"u":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       "overlap"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[-1,15]}})", "non-negative"},
      {R"({"t":"x"})", "not an object"},
  };
  for (const auto& c : cases) {
    test::write_bytes(path, with_header(c.header, 16));
    SCOPED_TRACE(c.header);
    expect_error(path, {path, c.needle});
  }
}

TEST(SafeTensors, MissingFileAndDirectory) {
  expect_error(test::scratch("does-not-exist.safetensors"), {"cannot open"});
  expect_error(PPX_TEST_DATA, {"not a regular file"});
}
