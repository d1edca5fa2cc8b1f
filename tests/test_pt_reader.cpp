#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "ppx/audio.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/pt_reader.h"
#include "ppx/safetensors.h"
#include "test_util.h"

using namespace ppx;
using namespace std::string_literals;

namespace {

// ---- A stored-zip writer (the layout torch.save produces, without its padding and Zip64 tail).

uint32_t crc32_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// Appends little-endian fields, each given as {value, byte count}.
void put(std::string* o, std::initializer_list<std::pair<uint32_t, int>> fields) {
  for (const auto& [v, n] : fields) {
    for (int k = 0; k < n; ++k) o->push_back(static_cast<char>(v >> (8 * k)));
  }
}

struct Entry {
  std::string name;
  std::string data;
  uint32_t method = 0;  // written as is; the data is never actually compressed
};

// A local file header followed by the entry's data.
std::string local_entry(const Entry& e) {
  std::string out;
  const uint32_t crc = crc32_bitwise(e.data), size = static_cast<uint32_t>(e.data.size());
  put(&out, {{0x04034b50u, 4}, {20, 2}, {0, 2}, {e.method, 2}, {0, 4}, {crc, 4}, {size, 4},
             {size, 4}, {static_cast<uint32_t>(e.name.size()), 2}, {0, 2}});
  return out + e.name + e.data;
}

// The central-directory record of `e`, whose local header is at `off`.
std::string cd_record(const Entry& e, uint32_t off) {
  std::string cd;
  const uint32_t crc = crc32_bitwise(e.data), size = static_cast<uint32_t>(e.data.size());
  put(&cd, {{0x02014b50u, 4}, {20, 2}, {20, 2}, {0, 2}, {e.method, 2}, {0, 4}, {crc, 4},
            {size, 4}, {size, 4}, {static_cast<uint32_t>(e.name.size()), 2}, {0, 2}, {0, 2},
            {0, 2}, {0, 2}, {0, 4}, {off, 4}});
  return cd + e.name;
}

// Local entries, then the central directory `cd` of `n` records, then the end record.
std::string finish_zip(std::string out, const std::string& cd, uint32_t n) {
  const auto cd_off = static_cast<uint32_t>(out.size());
  out += cd;
  put(&out, {{0x06054b50u, 4}, {0, 2}, {0, 2}, {n, 2}, {n, 2},
             {static_cast<uint32_t>(cd.size()), 4}, {cd_off, 4}, {0, 2}});
  return out;
}

std::string make_zip(const std::vector<Entry>& entries) {
  std::string out, cd;
  for (const Entry& e : entries) {
    cd += cd_record(e, static_cast<uint32_t>(out.size()));
    out += local_entry(e);
  }
  return finish_zip(out, cd, static_cast<uint32_t>(entries.size()));
}

// A torch.save-like archive "archive/..." holding `pkl` and storages data/<key>.
std::string torch_zip(const std::string& pkl, const std::map<std::string, std::string>& storages,
                      const std::string& byteorder = "little") {
  std::vector<Entry> e = {{"archive/data.pkl", pkl}, {"archive/byteorder", byteorder}};
  for (const auto& [key, bytes] : storages) e.push_back({"archive/data/" + key, bytes});
  e.push_back({"archive/version", "3\n"});
  return make_zip(e);
}

std::string write_tmp(const std::string& name, const std::string& bytes) {
  const std::string path = test::scratch(name);
  // A new file rather than a truncated one: ext4 flushes files rewritten via truncation on close.
  std::filesystem::remove(path);
  test::write_bytes(path, std::vector<char>(bytes.begin(), bytes.end()));
  return path;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// ---- Pickle pieces (protocol 2, as torch.save writes them).

std::string str(const std::string& s) {
  std::string o = "X";
  put(&o, {{static_cast<uint32_t>(s.size()), 4}});
  return o + s;
}
std::string glob(const std::string& module, const std::string& name) {
  return "c" + module + "\n" + name + "\n";
}
std::string int32(int32_t v) {
  std::string o = "J";
  put(&o, {{static_cast<uint32_t>(v), 4}});
  return o;
}
std::string ints(const std::vector<int64_t>& v) {
  std::string o = "(";
  for (int64_t x : v) o += int32(static_cast<int32_t>(x));
  return o + "t";
}
std::string tensor(const std::string& storage_type, const std::string& key, int64_t numel,
                   int64_t offset, const std::vector<int64_t>& size,
                   const std::vector<int64_t>& stride, const std::string& location = "cpu") {
  return glob("torch._utils", "_rebuild_tensor_v2") + "((" + str("storage") +
         glob("torch", storage_type) + str(key) + str(location) +
         int32(static_cast<int32_t>(numel)) + "tQ" + int32(static_cast<int32_t>(offset)) +
         ints(size) + ints(stride) + "\x89" + glob("collections", "OrderedDict") + ")Rt" + "R";
}
std::string dict_of(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string o = "\x80\x02}(";
  for (const auto& [k, v] : items) o += str(k) + v;
  return o + "u.";
}

// Expects reading `bytes` to throw ppx::Error whose message contains `needle`.
void expect_error(const std::string& bytes, const std::string& needle) {
  const std::string path = write_tmp("pt_bad.pt", bytes);
  try {
    read_pt_tensors(path);
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
}

// A valid single-tensor archive: f32 storage 0..11, tensor view given by offset/size/stride.
std::string f32_view(int64_t offset, const std::vector<int64_t>& size,
                     const std::vector<int64_t>& stride) {
  std::vector<float> s(12);
  for (int i = 0; i < 12; ++i) s[static_cast<size_t>(i)] = static_cast<float>(i);
  return torch_zip(dict_of({{"t", tensor("FloatStorage", "0", 12, offset, size, stride)}}),
                   {{"0", raw(s)}});
}

std::string golden_bytes(const std::string& name) {
  const std::vector<char> b = test::read_bytes(test::data(name));
  return std::string(b.begin(), b.end());
}

}  // namespace

TEST(PtReader, CudaVoiceMatchesItsContents) {
  const auto t = read_pt_tensors(test::data("voice_tiny_a_cuda.pt"));
  ASSERT_EQ(t.size(), 2u);
  SafeTensors ref(test::data("voice_tiny_a_cuda_contents.safetensors"));
  const PtTensor& emb = t.at("embeddings");
  EXPECT_EQ(emb.dtype, DType::kBF16);
  EXPECT_EQ(emb.shape, (std::vector<int64_t>{5, 1, 1, 128}));
  EXPECT_TRUE(emb.i64.empty());
  EXPECT_EQ(emb.shape, ref.info("embeddings").shape);
  EXPECT_EQ(emb.f32, ref.to_f32("embeddings"));  // exact
  const PtTensor& cache = t.at("cache");         // stored on cuda:0
  EXPECT_EQ(cache.dtype, DType::kI64);
  EXPECT_EQ(cache.shape, (std::vector<int64_t>{1, 17, 4}));
  EXPECT_TRUE(cache.f32.empty());
  EXPECT_EQ(cache.i64, ref.to_i64("cache"));
}

TEST(PtReader, F32VoiceLoads) {
  const auto t = read_pt_tensors(test::data("voice_tiny_a.pt"));
  ASSERT_EQ(t.size(), 2u);
  const PtTensor& emb = t.at("embeddings");
  EXPECT_EQ(emb.dtype, DType::kF32);
  EXPECT_EQ(emb.shape, (std::vector<int64_t>{5, 1, 1, 128}));
  ASSERT_EQ(emb.f32.size(), 640u);
  for (float x : emb.f32) ASSERT_TRUE(std::isfinite(x));
  // First values, read independently with Python's zipfile + struct.
  EXPECT_EQ(emb.f32[0], -4.55023193359375f);
  EXPECT_EQ(emb.f32[1], -5.791015625f);
  EXPECT_EQ(emb.f32[639], -7.43359375f);
  // Same prompt as the CUDA file, from the fp32 model: cache identical, embeddings close.
  SafeTensors ref(test::data("voice_tiny_a_cuda_contents.safetensors"));
  const PtTensor& cache = t.at("cache");
  EXPECT_EQ(cache.dtype, DType::kI64);
  EXPECT_EQ(cache.shape, (std::vector<int64_t>{1, 17, 4}));
  EXPECT_EQ(cache.i64, ref.to_i64("cache"));
  const std::vector<float> bf = ref.to_f32("embeddings");
  double num = 0, den = 0;
  for (size_t i = 0; i < bf.size(); ++i) {
    num += (emb.f32[i] - bf[i]) * (emb.f32[i] - bf[i]);
    den += emb.f32[i] * emb.f32[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.02);  // 0.0053 observed
}

TEST(PtReader, GathersStridedViewsOfSharedStorage) {
  std::vector<float> s(12);
  for (int i = 0; i < 12; ++i) s[static_cast<size_t>(i)] = static_cast<float>(i);
  const std::string pkl = dict_of({
      {"transposed", tensor("FloatStorage", "0", 12, 0, {4, 3}, {1, 4})},
      {"offset", tensor("FloatStorage", "0", 12, 5, {2}, {3})},
      {"scalar", tensor("FloatStorage", "0", 12, 11, {}, {})},
      {"broadcast", tensor("FloatStorage", "0", 12, 2, {2, 3}, {0, 1})},
      {"empty", tensor("FloatStorage", "0", 12, 12, {0, 7}, {7, 1})},
  });
  const auto t = read_pt_tensors(write_tmp("pt_views.pt", torch_zip(pkl, {{"0", raw(s)}})));
  EXPECT_EQ(t.at("transposed").shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(t.at("transposed").f32, (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(t.at("offset").f32, (std::vector<float>{5, 8}));
  EXPECT_TRUE(t.at("scalar").shape.empty());
  EXPECT_EQ(t.at("scalar").f32, (std::vector<float>{11}));
  EXPECT_EQ(t.at("broadcast").f32, (std::vector<float>{2, 3, 4, 2, 3, 4}));
  EXPECT_EQ(t.at("empty").shape, (std::vector<int64_t>{0, 7}));
  EXPECT_TRUE(t.at("empty").f32.empty());
}

TEST(PtReader, ReadsEveryDtypeAndOrderedDictTopLevel) {
  // OrderedDict at top level, SHORT_BINUNICODE / MEMOIZE / FRAME / STACK_GLOBAL / LONG1 / BINGET.
  const std::string od = "\x8c\x0b"s + "collections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94";
  std::string pkl = "\x80\x04\x95"s + std::string(8, '\0') + od + "(";
  pkl += str("h") + tensor("HalfStorage", "h", 2, 0, {2}, {1});
  pkl += str("b") + tensor("BFloat16Storage", "b", 2, 0, {2}, {1}, "cuda:1");
  pkl += str("i") + tensor("IntStorage", "i", 2, 0, {2}, {1});
  pkl += str("u") + tensor("ByteStorage", "u", 2, 0, {2}, {1});
  pkl += str("o") + tensor("BoolStorage", "o", 2, 0, {2}, {1});
  pkl += str("l") + glob("torch._utils", "_rebuild_tensor_v2") + "((" + str("storage") +
         glob("torch", "LongStorage") + str("l") + str("cpu") + "\x8a\x01\x02tQ\x8a\x00"s +
         "\x8a\x01\x02\x85\x8a\x01\x01\x85\x88h\x02)RtR";  // memo 2: the OrderedDict global
  pkl += "u.";
  const std::vector<uint16_t> h = {0x3c00, 0xc000};  // 1, -2
  const std::vector<uint16_t> b = {0x3f80, 0x4049};  // 1, 3.140625
  const std::vector<int32_t> i = {-7, 1 << 30};
  const std::vector<uint8_t> u = {0, 255};
  const std::vector<uint8_t> o = {1, 0};
  const std::vector<int64_t> l = {-1, int64_t{1} << 40};
  const std::map<std::string, std::string> storages = {
      {"h", raw(h)}, {"b", raw(b)}, {"i", raw(i)}, {"u", raw(u)}, {"o", raw(o)}, {"l", raw(l)}};
  const auto t = read_pt_tensors(write_tmp("pt_dtypes.pt", torch_zip(pkl, storages)));
  EXPECT_EQ(t.at("h").dtype, DType::kF16);
  EXPECT_EQ(t.at("h").f32, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(t.at("b").dtype, DType::kBF16);
  EXPECT_EQ(t.at("b").f32, (std::vector<float>{1.0f, 3.140625f}));
  EXPECT_EQ(t.at("i").dtype, DType::kI32);
  EXPECT_EQ(t.at("i").i64, (std::vector<int64_t>{-7, 1 << 30}));
  EXPECT_EQ(t.at("u").i64, (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(t.at("o").dtype, DType::kBool);
  EXPECT_EQ(t.at("o").i64, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(t.at("l").i64, l);
}

TEST(PtReader, RefusesForbiddenGlobalsWithoutRunningThem) {
  const std::string canary = test::scratch("pt_canary");
  std::filesystem::remove(canary);
  expect_error(
      torch_zip("\x80\x02" + glob("os", "system") + "(" + str("touch " + canary) + "tR.", {}),
      "refusing to load global 'os.system'");
  EXPECT_FALSE(std::filesystem::exists(canary));
  expect_error(torch_zip("\x80\x02" + glob("builtins", "eval") + "(" + str("1") + "tR.", {}),
               "refusing to load global 'builtins.eval'");
  expect_error(torch_zip(dict_of({{"t", glob("torch._utils", "_rebuild_parameter")}}), {}),
               "refusing to load global 'torch._utils._rebuild_parameter'");
  expect_error(torch_zip("\x80\x04\x8c\x05posix\x8c\x06system\x93.", {}),
               "refusing to load global 'posix.system'");
  // An allowed global that is not callable.
  expect_error(torch_zip("\x80\x02" + glob("torch", "FloatStorage") + ")R.", {}),
               "refusing to call torch.FloatStorage");
}

TEST(PtReader, RefusesCompressedEntries) {
  std::vector<float> s(12, 1.0f);
  const std::string pkl = dict_of({{"t", tensor("FloatStorage", "0", 12, 0, {12}, {1})}});
  expect_error(make_zip({{"archive/data.pkl", pkl}, {"archive/data/0", raw(s), 8}}),
               "is compressed (method 8)");
}

TEST(PtReader, RefusesBadStorageReferences) {
  std::vector<float> s(12, 1.0f);
  auto one = [&](const std::string& key, int64_t numel, const std::string& type = "FloatStorage") {
    return torch_zip(dict_of({{"t", tensor(type, key, numel, 0, {1}, {1})}}), {{"0", raw(s)}});
  };
  expect_error(one("1", 12), "has no zip entry 'archive/data/1'");
  expect_error(one("../0", 12), "is not a plain name");
  expect_error(one("0", 13), "holds 48 bytes");
  expect_error(one("0", 12, "LongStorage"), "holds 48 bytes");
  expect_error(one("0", -1), "-1 elements");
  // Same key used with two types.
  const std::string pkl = dict_of({{"a", tensor("FloatStorage", "0", 12, 0, {1}, {1})},
                                   {"b", tensor("IntStorage", "0", 12, 0, {1}, {1})}});
  expect_error(torch_zip(pkl, {{"0", raw(s)}}), "two different types");
}

TEST(PtReader, RefusesOutOfRangeViews) {
  EXPECT_NO_THROW(read_pt_tensors(write_tmp("pt_ok.pt", f32_view(11, {1}, {1}))));
  EXPECT_NO_THROW(read_pt_tensors(write_tmp("pt_ok.pt", f32_view(0, {3, 4}, {4, 1}))));
  expect_error(f32_view(12, {1}, {1}), "reach past the end");
  expect_error(f32_view(13, {0}, {1}), "storage offset 13");
  expect_error(f32_view(-1, {1}, {1}), "storage offset -1");
  expect_error(f32_view(0, {13}, {1}), "reach past the end");
  expect_error(f32_view(0, {3, 4}, {5, 1}), "reach past the end");
  expect_error(f32_view(1, {2}, {11}), "reach past the end");
  expect_error(f32_view(0, {2}, {0x7fffffff}), "reach past the end");
  expect_error(f32_view(0, {2}, {-1}), "non-negative");
  expect_error(f32_view(0, {2, 2}, {1}), "ranks differ");
  expect_error(f32_view(0, {65536, 65536}, {0, 0}), "more than 2^28");
  std::vector<int64_t> many(40000, 1);
  expect_error(f32_view(0, many, many), "exceed");
}

TEST(PtReader, RefusesTruncatedOrCorruptedGolden) {
  const std::string good = golden_bytes("voice_tiny_a_cuda.pt");
  const auto ref = read_pt_tensors(test::data("voice_tiny_a_cuda.pt"));
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string path = write_tmp("pt_trunc.pt", good.substr(0, n));
    EXPECT_THROW(read_pt_tensors(path), Error) << "prefix of " << n << " bytes";
  }
  // Every single-byte change is caught or leaves the contents untouched.
  int caught = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x41);
    try {
      const auto t = read_pt_tensors(write_tmp("pt_flip.pt", bad));
      ASSERT_EQ(t.size(), 2u) << "byte " << i;
      EXPECT_EQ(t.at("embeddings").f32, ref.at("embeddings").f32) << "byte " << i;
      EXPECT_EQ(t.at("cache").i64, ref.at("cache").i64) << "byte " << i;
    } catch (const Error&) {
      ++caught;
    }
  }
  EXPECT_GT(caught, 2000);  // every byte of data.pkl and the storages is CRC-protected
}

TEST(PtReader, RefusesRandomBytesAndMutatedPickles) {
  std::mt19937 rng(1234);
  for (int it = 0; it < 100; ++it) {
    std::string junk(rng() % 4096, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (it % 2) junk += make_zip({});  // junk before an empty archive
    EXPECT_THROW(read_pt_tensors(write_tmp("pt_junk.pt", junk)), Error);
  }
  // Mutated pickles inside well-formed archives exercise the pickle machine: load or ppx::Error.
  std::string pkl;
  {
    const std::string z = golden_bytes("voice_tiny_a_cuda.pt");
    const size_t at = z.find("\x80\x02}q");
    ASSERT_NE(at, std::string::npos);
    pkl = z.substr(at, 289);
    ASSERT_EQ(pkl.back(), '.');
  }
  SafeTensors ref(test::data("voice_tiny_a_cuda_contents.safetensors"));
  std::vector<uint16_t> emb;
  for (float f : ref.to_f32("embeddings")) emb.push_back(f32_to_bf16(f));
  const std::map<std::string, std::string> storages = {{"0", raw(emb)},
                                                       {"1", raw(ref.to_i64("cache"))}};
  // Our archive folder is "archive"; the pickle does not name it.
  EXPECT_EQ(read_pt_tensors(write_tmp("pt_rebuilt.pt", torch_zip(pkl, storages))).size(), 2u);
  int loaded = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string bad = pkl;
    for (unsigned k = 0, n = 1 + rng() % 3; k < n; ++k) {
      bad[rng() % bad.size()] = static_cast<char>(rng() % 3 ? rng() : "(tq)h\x85}RQ."[rng() % 10]);
    }
    try {
      read_pt_tensors(write_tmp("pt_mut.pt", torch_zip(bad, storages)));
      ++loaded;
    } catch (const Error&) {
    }
  }
  EXPECT_LT(loaded, 3000);
}

TEST(PtReader, RefusesZip64ByteorderAndNonTorchArchives) {
  std::string z = f32_view(0, {1}, {1});
  std::string z64 = z;
  z64[z64.size() - 22 + 8] = z64[z64.size() - 22 + 9] = '\xff';  // entry count 0xFFFF
  expect_error(z64, "archive needs Zip64 fields");
  std::string entry64 = z;
  const size_t cd = entry64.find("PK\x01\x02");
  entry64.replace(cd + 20, 8, 8, '\xff');  // compressed and uncompressed size 0xFFFFFFFF
  expect_error(entry64, "needs Zip64 fields");
  // torch writes a Zip64 end record even for small archives; it must agree with the classic one.
  std::string g64 = golden_bytes("voice_tiny_a_cuda.pt");
  g64[g64.size() - 22 - 20 - 56 + 24] ^= 1;  // entry count of the Zip64 end record
  expect_error(g64, "Zip64 end record disagrees");
  std::vector<float> s(12, 0.0f);
  const std::string pkl = dict_of({{"t", tensor("FloatStorage", "0", 12, 0, {1}, {1})}});
  expect_error(torch_zip(pkl, {{"0", raw(s)}}, "big"), "byte order is 'big'");
  expect_error(make_zip({{"data.pkl", pkl}, {"data/0", raw(s)}}), "no <name>/data.pkl");
  std::string crc = z;
  crc[crc.find("\x80\x02") + 2] = ')';  // data.pkl changed, CRC not
  expect_error(crc, "CRC32 mismatch in zip entry 'archive/data.pkl'");
  expect_error("\x80\x02\x8a\x0a"s + std::string(40, '\0'), "legacy (non-zip) torch.save format");
  const std::string missing = test::scratch("pt_does_not_exist.pt");
  EXPECT_THROW(read_pt_tensors(missing), Error);
}

TEST(PtReader, RefusesNonTensorStructures) {
  std::vector<float> s(12, 0.0f);
  const std::string t = tensor("FloatStorage", "0", 12, 0, {1}, {1});
  auto zip = [&](const std::string& pkl) { return torch_zip(pkl, {{"0", raw(s)}}); };
  expect_error(zip("\x80\x02" + t + "."), "top-level object is a tensor");
  expect_error(zip("\x80\x02}" + str("a") + "K\x01s."), "value of key 'a' is a int");
  expect_error(zip("\x80\x02}K\x01" + t + "s."), "dict key is a int");
  expect_error(zip(dict_of({{"a", t}, {"a", t}})), "duplicate key 'a'");
  // One tensor object under two keys (memoized): both get its values.
  const auto shared = read_pt_tensors(
      write_tmp("pt_shared.pt", zip("\x80\x02}(" + str("a") + t + "q\x09" + str("b") + "h\x09u.")));
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(shared.at("a").f32, (std::vector<float>{0.0f}));
  EXPECT_EQ(shared.at("b").f32, shared.at("a").f32);
  expect_error(zip("\x80\x02}" + str("a") + "}s."), "is a dict, not a tensor");
  expect_error(zip("\x80\x02(" + glob("os", "system")), "refusing");  // before truncation
  expect_error(zip("\x80\x02}("), "truncated");
  expect_error(zip("\x80\x02}(ccollections\nOrderedDict"), "unterminated");
  EXPECT_TRUE(read_pt_tensors(write_tmp("pt_empty.pt", zip("\x80\x02}."))).empty());
  expect_error(zip("\x80\x02}}."), "STOP with a stack");
  expect_error(zip("\x80\x02}.."), "bytes follow STOP");
  expect_error(zip("\x80\x02(i__main__\nX\n."), "unsupported pickle opcode 0x69 ('i')");
  expect_error(zip("\x80\x02}(\x81"), "opcode at offset 4: unsupported pickle opcode 0x81");
  expect_error(zip("\x80\x02}h\x07"), "memo index 7 is unset");
  expect_error(zip("\x80\x02K\x01(\x85"), "pickle stack underflow");  // pops cannot cross a MARK
  expect_error(zip("\x80\x02" + ("K\x01" + std::string(100000, '\x85')) + "."), "nest deeper");
  expect_error(zip("\x80\x02" + std::string(100000, 'N') + "."), "stack exceeds");
  expect_error(zip("\x80\x02" + std::string(1000, '(') + "."), "MARKs nest deeper");
  std::string refs;  // 60000 references to memo 0
  for (int k = 0; k < 60000; ++k) refs += "h\x00"s;
  std::string wide = "\x80\x02K\x01q\x00"s;
  for (int k = 0; k < 20; ++k) wide += "(" + refs + "t";
  expect_error(zip(wide + "."), "tuples hold too many items");
  expect_error(zip("\x80\x02}N}b."), "unsupported BUILD");
  expect_error(zip(dict_of({{"\xff", t}})), "not valid UTF-8");
  expect_error(
      zip("\x80\x02}" + str("a") + glob("torch._utils", "_rebuild_tensor_v2") + "(K\x01tRs."),
      "unexpected arguments");
}

// Hardening: each of these failed (loaded, or failed for another reason) before the fix.

TEST(PtReader, CountsEveryCopyOfATensorStoredUnderSeveralKeys) {
  // One memoized 2^24-element int64 tensor (128 MiB once converted; a stride-0 view of a single
  // element) stored under three keys would be materialized three times (384 MiB): over the
  // 256 MiB budget, refused at the third key.
  const std::vector<int64_t> one = {7};
  const std::string t = tensor("LongStorage", "0", 1, 0, {1 << 24}, {0});
  const std::string pkl = "\x80\x02}(" + str("a") + t + "q\x09" + str("b") + "h\x09" + str("c") +
                          "h\x09u.";
  expect_error(torch_zip(pkl, {{"0", raw(one)}}), "more than 256 MiB");
}

TEST(PtReader, RefusesOverlappingZipEntries) {
  // Entry data/0's bytes are data/1's local header and data: both CRCs are right, but the bytes
  // of data/1 are read (and checksummed) twice. With 65535 such entries the CRC work would be
  // unbounded; any overlap is refused.
  const std::vector<float> s(12, 1.0f);
  const Entry inner{"archive/data/1", raw(s)};
  const Entry outer{"archive/data/0", local_entry(inner)};
  const std::string pkl = dict_of({{"a", tensor("ByteStorage", "0", static_cast<int64_t>(outer.data.size()), 0, {1}, {1})},
                                   {"b", tensor("FloatStorage", "1", 12, 0, {12}, {1})}});
  const Entry head{"archive/data.pkl", pkl};
  std::string out = local_entry(head);
  const auto outer_off = static_cast<uint32_t>(out.size());
  out += local_entry(outer);
  const auto inner_off = static_cast<uint32_t>(outer_off + 30 + outer.name.size());
  const std::string cd = cd_record(head, 0) + cd_record(outer, outer_off) + cd_record(inner, inner_off);
  expect_error(finish_zip(out, cd, 3), "overlap");
  // The same entries laid out one after the other load.
  const auto t = read_pt_tensors(write_tmp("pt_disjoint.pt", make_zip({head, outer, inner})));
  EXPECT_EQ(t.at("b").f32, s);
  // Two directory records for one local entry (different names cannot share a local header,
  // so the second record's name disagrees with it or duplicates the first).
  const std::string twice = cd_record(head, 0) + cd_record(outer, outer_off) + cd_record(outer, outer_off);
  expect_error(finish_zip(out, twice, 3), "zip entry 'archive/data/0'");
}

TEST(PtReader, VoiceFilesOverTheSizeCapAreRefusedBeforeReading) {
  // 64 MiB + 1 byte, sparse: refused by size, naming the file and the cap, for both voice kinds.
  for (const char* name : {"voice_huge.pt", "voice_huge.wav"}) {
    const std::string path = test::scratch(name);
    std::filesystem::remove(path);
    test::write_bytes(path, {});
    std::filesystem::resize_file(path, (uint64_t{64} << 20) + 1);
    try {
      if (std::string(name).ends_with(".pt")) load_voice_embeddings(path);
      else prepare_voice_audio(path);
      ADD_FAILURE() << name << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("64 MiB"), std::string::npos) << msg;
    }
    std::filesystem::remove(path);
  }
}

TEST(PtReader, ReadsFromMemoryLikeFromAFile) {
  const std::string bytes = golden_bytes("voice_tiny_a_cuda.pt");
  const auto from_file = read_pt_tensors(test::data("voice_tiny_a_cuda.pt"));
  const auto from_bytes = read_pt_tensors_from_bytes(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "in-memory voice");
  ASSERT_EQ(from_bytes.size(), 2u);
  EXPECT_EQ(from_bytes.at("embeddings").f32, from_file.at("embeddings").f32);
  EXPECT_EQ(from_bytes.at("cache").i64, from_file.at("cache").i64);
  try {
    read_pt_tensors_from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), 100, "cut voice");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'cut voice'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_pt_tensors_from_bytes(nullptr, 0, "empty"), Error);
}
