// Safe torch.save reader: a stored-zip parser and a restricted pickle stack machine.
// Contract and limits: see pt_reader.h.
#include "ppx/pt_reader.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <unordered_map>

#include "ppx/error.h"

namespace ppx {
namespace {

static_assert(std::endian::native == std::endian::little, "pt_reader assumes a little-endian host");

// Limits against hostile files; real voice prompts are far below all of them.
constexpr uint64_t kMaxFileBytes = (4ull << 30) + (1ull << 20);  // more needs Zip64
constexpr uint64_t kMaxPickleBytes = 16ull << 20;  // torch writes ~300 bytes per tensor
constexpr int64_t kMaxElements = int64_t{1} << 28;  // per storage and per tensor (real voices: ~1M)
// All tensors as returned (4 bytes per float element, 8 per integer one), every key of a tensor
// stored under several keys counted again: real voices need ~4 MiB.
constexpr uint64_t kMaxMaterializedBytes = 256ull << 20;
// Bytes CRC-checked in all: entries are disjoint and each is checked once, so this only bounds
// files that are mostly referenced storage (real voices: a few MiB).
constexpr uint64_t kMaxChecksummedBytes = 1ull << 30;
constexpr size_t kMaxStack = 1 << 16;
constexpr size_t kMaxMarks = 64;
constexpr size_t kMaxMemo = 1 << 16;
constexpr size_t kMaxTupleItems = 1 << 20;  // all tuples together; torch needs ~20 per tensor
constexpr int kMaxDepth = 8;                // nesting of tuples; torch needs 2
constexpr size_t kMaxRank = 16;
constexpr size_t kMaxLine = 256;  // GLOBAL module and name lines

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("torch file '" + path + "': " + what);
}

// Printable, length-capped rendering of untrusted text for error messages.
std::string printable(const std::string& s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    const char c = s[i];
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return out + (s.size() > 80 ? "...'" : "'");
}

uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t rd32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t rd64(const uint8_t* p) { return uint64_t{rd32(p)} | uint64_t{rd32(p + 4)} << 32; }

uint32_t crc32(const uint8_t* p, uint64_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (uint64_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || s.size() - i - 1 < static_cast<size_t>(n)) return false;
    for (int k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Zip archive of stored entries, parsed from the central directory. Every entry's data range is
// checked to lie inside the file, before the central directory.

struct ZipEntry {
  uint64_t data;  // offset of the first data byte
  uint64_t size;
  uint32_t crc;
  bool checked = false;  // CRC32 verified
};

struct Archive {
  std::string path;
  const uint8_t* bytes = nullptr;  // the whole file, owned by the caller
  uint64_t n_bytes = 0;
  std::map<std::string, ZipEntry> entries;
  uint64_t checksummed = 0;  // bytes CRC-checked so far (kMaxChecksummedBytes)

  [[noreturn]] void fail(const std::string& what) const { ppx::fail(path, what); }

  // Returns the bytes of entry `name` after checking its CRC32 (once per entry, within the
  // checksum budget); null when there is no such entry.
  const uint8_t* read(const std::string& name, uint64_t* size) {
    const auto it = entries.find(name);
    if (it == entries.end()) return nullptr;
    ZipEntry& e = it->second;
    const uint8_t* p = bytes + e.data;
    if (!e.checked) {
      checksummed += e.size;
      if (checksummed > kMaxChecksummedBytes) {
        fail("entries to checksum exceed " + std::to_string(kMaxChecksummedBytes >> 20) + " MiB");
      }
      if (crc32(p, e.size) != e.crc) fail("CRC32 mismatch in zip entry " + printable(name));
      e.checked = true;
    }
    *size = e.size;
    return p;
  }
};

void parse_zip(Archive* ar) {
  const uint8_t* b = ar->bytes;
  const uint64_t n = ar->n_bytes;
  if (n >= 2 && b[0] == 0x80 && b[1] <= 5) {
    ar->fail("file is in the legacy (non-zip) torch.save format, which is not supported; "
             "re-save it with a current PyTorch");
  }
  if (n < 22) ar->fail("file is " + std::to_string(n) + " bytes, too short for a zip archive");
  // End of central directory: the last signature whose comment ends exactly at the end of file.
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = n > 22 + 0xFFFF ? n - 22 - 0xFFFF : 0;
  for (uint64_t p = n - 22 + 1; p-- > lowest;) {
    if (rd32(b + p) == 0x06054b50u && p + 22 + rd16(b + p + 20) == n) {
      eocd = p;
      break;
    }
  }
  if (eocd == UINT64_MAX) ar->fail("no zip end-of-central-directory record (truncated?)");
  const uint8_t* e = b + eocd;
  const uint16_t n_disk = rd16(e + 8), n_total = rd16(e + 10);
  const uint32_t cd_size = rd32(e + 12), cd_off = rd32(e + 16);
  if (n_disk == 0xFFFF || n_total == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
    ar->fail("archive needs Zip64 fields, which are not supported");
  }
  if (rd16(e + 4) != 0 || rd16(e + 6) != 0 || n_disk != n_total) {
    ar->fail("multi-disk zip archives are not supported");
  }
  // torch writes a Zip64 end record and locator even when nothing needs Zip64; they are accepted
  // only when they repeat the classic record's values.
  uint64_t cd_limit = eocd;
  if (eocd >= 20 && rd32(b + eocd - 20) == 0x07064b50u) {
    const uint8_t* loc = b + eocd - 20;
    const uint64_t rec = rd64(loc + 8);
    if (rd32(loc + 4) != 0 || rd32(loc + 16) != 1 || rec > eocd - 20 || eocd - 20 - rec < 56 ||
        rd32(b + rec) != 0x06064b50u || rd64(b + rec + 4) > eocd - 20 - rec - 12) {
      ar->fail("damaged Zip64 end-of-central-directory locator or record");
    }
    const uint8_t* r = b + rec;
    if (rd32(r + 16) != 0 || rd32(r + 20) != 0 || rd64(r + 24) != n_disk ||
        rd64(r + 32) != n_total || rd64(r + 40) != cd_size || rd64(r + 48) != cd_off) {
      ar->fail("Zip64 end record disagrees with the classic one (Zip64 is not supported)");
    }
    cd_limit = rec;
  }
  if (cd_off > cd_limit || cd_size > cd_limit - cd_off) {
    ar->fail("central directory lies outside the archive (truncated?)");
  }
  uint64_t p = cd_off;
  const uint64_t cd_end = uint64_t{cd_off} + cd_size;
  struct Span {
    uint64_t begin, end;  // [local header, end of data)
    std::string name;
  };
  std::vector<Span> spans;
  for (unsigned i = 0; i < n_total; ++i) {
    const std::string what_i = std::to_string(i);
    if (cd_end - p < 46 || rd32(b + p) != 0x02014b50u) {
      ar->fail("central directory entry " + what_i + " is damaged");
    }
    const uint8_t* c = b + p;
    const uint16_t flags = rd16(c + 8), method = rd16(c + 10);
    const uint32_t crc = rd32(c + 16), csize = rd32(c + 20), usize = rd32(c + 24);
    const uint16_t name_len = rd16(c + 28);
    const uint32_t loff = rd32(c + 42);
    const uint64_t rec_len = 46ull + name_len + rd16(c + 30) + rd16(c + 32);
    if (rec_len > cd_end - p) ar->fail("central directory entry " + what_i + " is damaged");
    const std::string name(reinterpret_cast<const char*>(c + 46), name_len);
    const std::string what = "zip entry " + printable(name);
    if (csize == 0xFFFFFFFFu || usize == 0xFFFFFFFFu || loff == 0xFFFFFFFFu || rd16(c + 34) != 0) {
      ar->fail(what + " needs Zip64 fields, which are not supported");
    }
    if (flags & 1u) ar->fail(what + " is encrypted");
    if (method != 0) {
      ar->fail(what + " is compressed (method " + std::to_string(method) +
               "); only stored (uncompressed) entries are supported, as torch.save writes them");
    }
    if (csize != usize) ar->fail(what + " is stored but its sizes differ");
    if (loff > cd_off || cd_off - loff < 30 || rd32(b + loff) != 0x04034b50u) {
      ar->fail(what + ": local header is damaged or outside the archive");
    }
    const uint8_t* l = b + loff;
    const uint64_t data = loff + 30ull + rd16(l + 26) + rd16(l + 28);
    if (rd16(l + 26) != name_len || data > cd_off || std::memcmp(l + 30, c + 46, name_len) != 0 ||
        rd16(l + 8) != 0) {
      ar->fail(what + ": local header disagrees with the central directory");
    }
    if (usize > cd_off - data) ar->fail(what + ": data lies outside the archive (truncated?)");
    if (!ar->entries.emplace(name, ZipEntry{data, usize, crc}).second) {
      ar->fail("duplicate " + what);
    }
    spans.push_back({loff, data + usize, name});
    p += rec_len;
  }
  if (p != cd_end) ar->fail("central directory size disagrees with its entries");
  // Entries must not share bytes: otherwise a small file could name the same bytes up to 65535
  // times, and checksumming them would take unbounded time.
  std::sort(spans.begin(), spans.end(),
            [](const Span& x, const Span& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      ar->fail("zip entries " + printable(spans[i - 1].name) + " and " + printable(spans[i].name) +
               " overlap");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pickle values. Only tuples nest (bounded by kMaxDepth); dict values are always tensors, so the
// object graph is acyclic and shallow.

enum class Kind { kNone, kBool, kInt, kStr, kTuple, kDict, kGlobal, kStorage, kTensor };
enum class Callable { kOrderedDict, kRebuildTensorV2, kStorageType };

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  Kind kind = Kind::kNone;
  int depth = 0;
  int64_t i = 0;                            // kBool (0/1), kInt
  std::string s;                            // kStr; kGlobal: qualified name; kStorage: key
  std::vector<ValuePtr> items;              // kTuple
  std::map<std::string, ValuePtr> entries;  // kDict; values are tensors
  Callable callable{};                      // kGlobal
  DType dtype{};                            // kGlobal (storage type), kStorage
  const uint8_t* data = nullptr;            // kStorage: numel elements of dtype
  int64_t numel = 0;                        // kStorage
  PtTensor tensor;                          // kTensor
};

const char* kind_name(Kind k) {
  static constexpr const char* kNames[] = {"None", "bool",   "int",     "str",   "tuple",
                                           "dict", "global", "storage", "tensor"};
  return kNames[static_cast<int>(k)];
}

ValuePtr make_value(Kind k, int64_t i = 0) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  v->i = i;
  return v;
}

class Unpickler {
 public:
  Unpickler(Archive& ar, std::string prefix, const uint8_t* p, uint64_t n)
      : ar_(ar), prefix_(std::move(prefix)), p_(p), n_(n) {}

  // Runs the pickle to its STOP opcode and returns the single object it built.
  ValuePtr run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    ar_.fail(prefix_ + "data.pkl, opcode at offset " + std::to_string(op_pos_) + ": " + what);
  }
  const uint8_t* take(uint64_t k) {
    if (k > n_ - pos_) fail("pickle is truncated (needs " + std::to_string(k) + " more bytes)");
    const uint8_t* q = p_ + pos_;
    pos_ += k;
    return q;
  }
  std::string take_str(uint64_t k) {
    const uint8_t* q = take(k);
    std::string s(reinterpret_cast<const char*>(q), k);
    if (!valid_utf8(s)) fail("string is not valid UTF-8");
    return s;
  }
  std::string take_line() {
    for (uint64_t k = 0; k < kMaxLine && pos_ + k < n_; ++k) {
      if (p_[pos_ + k] == '\n') {
        std::string s(reinterpret_cast<const char*>(p_ + pos_), k);
        pos_ += k + 1;
        return s;
      }
    }
    fail("GLOBAL name is unterminated or too long");
  }
  void push(ValuePtr v) {
    if (stack_.size() >= kMaxStack) fail("pickle stack exceeds " + std::to_string(kMaxStack));
    stack_.push_back(std::move(v));
  }
  size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  ValuePtr pop() {
    if (stack_.size() <= base()) fail("pickle stack underflow");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const ValuePtr& top() const {
    if (stack_.size() <= base()) fail("pickle stack underflow");
    return stack_.back();
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    std::vector<ValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                                stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  ValuePtr make_tuple(std::vector<ValuePtr> items) {
    auto v = make_value(Kind::kTuple);
    for (const auto& it : items) v->depth = std::max(v->depth, it->depth + 1);
    if (v->depth > kMaxDepth) fail("tuples nest deeper than " + std::to_string(kMaxDepth));
    tuple_items_ += items.size();
    if (tuple_items_ > kMaxTupleItems) fail("tuples hold too many items in total");
    v->items = std::move(items);
    return v;
  }
  ValuePtr find_global(const std::string& module, const std::string& name);
  ValuePtr persistent_load(const ValuePtr& pid);
  ValuePtr reduce(const ValuePtr& fn, const ValuePtr& args);
  ValuePtr rebuild_tensor(const std::vector<ValuePtr>& a);
  void set_item(const ValuePtr& dict, const ValuePtr& key, const ValuePtr& value);

  // Counts `bytes` more of returned tensor data against kMaxMaterializedBytes, before allocating.
  void materialize(uint64_t bytes) {
    materialized_bytes_ += bytes;
    if (materialized_bytes_ > kMaxMaterializedBytes) {
      fail("tensors take more than " + std::to_string(kMaxMaterializedBytes >> 20) +
           " MiB once converted (a tensor stored under several keys counts once per key)");
    }
  }
  static uint64_t tensor_bytes(const PtTensor& t) {
    return t.f32.size() * sizeof(float) + t.i64.size() * sizeof(int64_t);
  }

  Archive& ar_;
  const std::string prefix_;  // "<name>/"
  const uint8_t* p_;
  const uint64_t n_;
  uint64_t pos_ = 0;
  uint64_t op_pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;  // stack sizes at each open MARK
  std::unordered_map<uint32_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;  // by key
  uint64_t materialized_bytes_ = 0;
  std::set<const Value*> stored_;  // tensors already stored under some dict key
  size_t tuple_items_ = 0;
};

ValuePtr Unpickler::find_global(const std::string& module, const std::string& name) {
  struct Allowed {
    const char* module;
    const char* name;
    Callable callable;
    DType dtype;
  };
  static constexpr Allowed kAllowed[] = {
      {"collections", "OrderedDict", Callable::kOrderedDict, DType::kF32},
      {"torch._utils", "_rebuild_tensor_v2", Callable::kRebuildTensorV2, DType::kF32},
      {"torch", "FloatStorage", Callable::kStorageType, DType::kF32},
      {"torch", "HalfStorage", Callable::kStorageType, DType::kF16},
      {"torch", "BFloat16Storage", Callable::kStorageType, DType::kBF16},
      {"torch", "LongStorage", Callable::kStorageType, DType::kI64},
      {"torch", "IntStorage", Callable::kStorageType, DType::kI32},
      {"torch", "ByteStorage", Callable::kStorageType, DType::kU8},
      {"torch", "BoolStorage", Callable::kStorageType, DType::kBool},
  };
  for (const Allowed& a : kAllowed) {
    if (module == a.module && name == a.name) {
      auto v = make_value(Kind::kGlobal);
      v->s = module + "." + name;
      v->callable = a.callable;
      v->dtype = a.dtype;
      return v;
    }
  }
  fail("refusing to load global " + printable(module + "." + name) +
       " (only tensor dicts of plain storages are accepted)");
}

ValuePtr Unpickler::persistent_load(const ValuePtr& pid) {
  const auto& t = pid->items;
  if (pid->kind != Kind::kTuple || t.size() != 5 || t[0]->kind != Kind::kStr ||
      t[0]->s != "storage" || t[1]->kind != Kind::kGlobal ||
      t[1]->callable != Callable::kStorageType || t[2]->kind != Kind::kStr ||
      t[3]->kind != Kind::kStr || t[4]->kind != Kind::kInt) {
    fail("persistent id is not ('storage', <storage type>, key, location, numel)");
  }
  const std::string& key = t[2]->s;
  const DType dtype = t[1]->dtype;
  const int64_t numel = t[4]->i;
  bool key_ok = !key.empty() && key.size() <= 64;
  for (char c : key) key_ok = key_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!key_ok) fail("storage key " + printable(key) + " is not a plain name");
  if (numel < 0 || numel > kMaxElements) {
    fail("storage " + printable(key) + " has " + std::to_string(numel) + " elements");
  }
  if (const auto it = storages_.find(key); it != storages_.end()) {
    if (it->second->dtype != dtype || it->second->numel != numel) {
      fail("storage " + printable(key) + " is used with two different types or sizes");
    }
    return it->second;
  }
  const std::string entry = prefix_ + "data/" + key;
  uint64_t size = 0;
  const uint8_t* data = ar_.read(entry, &size);
  if (!data) fail("storage " + printable(key) + " has no zip entry " + printable(entry));
  if (size != static_cast<uint64_t>(numel) * dtype_size(dtype)) {
    fail("zip entry " + printable(entry) + " holds " + std::to_string(size) + " bytes, but its " +
         t[1]->s + " has " + std::to_string(numel) + " elements");
  }
  auto v = make_value(Kind::kStorage);
  v->s = key;
  v->dtype = dtype;
  v->data = data;
  v->numel = numel;
  storages_.emplace(key, v);
  return v;
}

ValuePtr Unpickler::reduce(const ValuePtr& fn, const ValuePtr& args) {
  if (fn->kind != Kind::kGlobal) fail(std::string("REDUCE on a ") + kind_name(fn->kind));
  if (args->kind != Kind::kTuple) fail("REDUCE arguments are not a tuple");
  switch (fn->callable) {
    case Callable::kOrderedDict: {
      if (!args->items.empty()) fail("collections.OrderedDict called with arguments");
      return make_value(Kind::kDict);
    }
    case Callable::kRebuildTensorV2:
      return rebuild_tensor(args->items);
    case Callable::kStorageType:
      break;
  }
  fail("refusing to call " + fn->s);
}

ValuePtr Unpickler::rebuild_tensor(const std::vector<ValuePtr>& a) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[,
  // metadata]); hooks and metadata must be empty.
  auto is_empty_dict = [](const ValuePtr& v) {
    return v->kind == Kind::kDict && v->entries.empty();
  };
  if ((a.size() != 6 && a.size() != 7) || a[0]->kind != Kind::kStorage ||
      a[1]->kind != Kind::kInt || a[2]->kind != Kind::kTuple || a[3]->kind != Kind::kTuple ||
      a[4]->kind != Kind::kBool || !is_empty_dict(a[5]) ||
      (a.size() == 7 && a[6]->kind != Kind::kNone && !is_empty_dict(a[6]))) {
    fail("unexpected arguments to torch._utils._rebuild_tensor_v2");
  }
  const Value& st = *a[0];
  const int64_t offset = a[1]->i;
  const auto& sizes = a[2]->items;
  const auto& strides = a[3]->items;
  const std::string what = "tensor on storage " + printable(st.s);
  if (sizes.size() != strides.size() || sizes.size() > kMaxRank) {
    fail(what + ": size and stride ranks differ or exceed " + std::to_string(kMaxRank));
  }
  PtTensor t;
  t.dtype = st.dtype;
  std::vector<int64_t> stride;
  int64_t numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d]->kind != Kind::kInt || strides[d]->kind != Kind::kInt || sizes[d]->i < 0 ||
        strides[d]->i < 0) {
      fail(what + ": sizes and strides must be non-negative integers");
    }
    t.shape.push_back(sizes[d]->i);
    stride.push_back(strides[d]->i);
    if (__builtin_mul_overflow(numel, sizes[d]->i, &numel) || numel > kMaxElements) {
      fail(what + ": more than 2^28 elements");
    }
  }
  if (offset < 0 || offset > st.numel) {
    fail(what + ": storage offset " + std::to_string(offset) + " is outside a storage of " +
         std::to_string(st.numel));
  }
  if (numel > 0) {
    // Largest element index reached; each term is checked so the sum stays below 2^62.
    int64_t last = offset;
    for (size_t d = 0; d < t.shape.size() && last < st.numel; ++d) {
      if (t.shape[d] > 1) {
        if (stride[d] >= st.numel) last = st.numel;
        else last += (t.shape[d] - 1) * stride[d];
      }
    }
    if (last >= st.numel) {
      fail(what + ": offset/sizes/strides reach past the end of a storage of " +
           std::to_string(st.numel) + " elements");
    }
  }
  const bool is_float = st.dtype == DType::kF32 || st.dtype == DType::kF16 ||
                        st.dtype == DType::kBF16;
  materialize(static_cast<uint64_t>(numel) * (is_float ? sizeof(float) : sizeof(int64_t)));
  if (is_float) t.f32.resize(static_cast<size_t>(numel));
  else t.i64.resize(static_cast<size_t>(numel));
  const size_t esz = dtype_size(st.dtype);
  std::vector<int64_t> index(t.shape.size(), 0);
  int64_t src = offset;
  for (int64_t k = 0; k < numel; ++k) {
    const uint8_t* q = st.data + static_cast<size_t>(src) * esz;
    const auto out = static_cast<size_t>(k);
    switch (st.dtype) {
      case DType::kF32: std::memcpy(&t.f32[out], q, 4); break;
      case DType::kF16: t.f32[out] = f16_to_f32(rd16(q)); break;
      case DType::kBF16: t.f32[out] = bf16_to_f32(rd16(q)); break;
      case DType::kI64: std::memcpy(&t.i64[out], q, 8); break;
      case DType::kI32: t.i64[out] = static_cast<int32_t>(rd32(q)); break;
      case DType::kU8: t.i64[out] = *q; break;
      case DType::kBool: t.i64[out] = *q != 0; break;
    }
    // Advance the multi-index (last dimension fastest) and the source element.
    for (size_t d = t.shape.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) {
        src += stride[d];
        break;
      }
      src -= (t.shape[d] - 1) * stride[d];
      index[d] = 0;
    }
  }
  auto v = make_value(Kind::kTensor);
  v->tensor = std::move(t);
  return v;
}

void Unpickler::set_item(const ValuePtr& dict, const ValuePtr& key, const ValuePtr& value) {
  if (dict->kind != Kind::kDict) fail(std::string("SETITEM on a ") + kind_name(dict->kind));
  if (key->kind != Kind::kStr) fail(std::string("dict key is a ") + kind_name(key->kind));
  if (value->kind != Kind::kTensor) {
    fail("value of key " + printable(key->s) + " is a " + kind_name(value->kind) +
         ", not a tensor");
  }
  if (!dict->entries.emplace(key->s, value).second) fail("duplicate key " + printable(key->s));
  // The reader returns one copy per key: count every key after the first.
  if (!stored_.insert(value.get()).second) materialize(tensor_bytes(value->tensor));
}

ValuePtr Unpickler::run() {
  while (true) {
    op_pos_ = pos_;
    const uint8_t op = *take(1);
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t v = *take(1);
        if (v < 2 || v > 5) fail("pickle protocol " + std::to_string(v) + " is not supported");
        break;
      }
      case 0x95: take(8); break;                     // FRAME: irrelevant in memory
      case '}': push(make_value(Kind::kDict)); break;  // EMPTY_DICT
      case ')': push(make_tuple({})); break;           // EMPTY_TUPLE
      case '(':                                        // MARK
        if (marks_.size() >= kMaxMarks) fail("MARKs nest deeper than " + std::to_string(kMaxMarks));
        marks_.push_back(stack_.size());
        break;
      case 'X': case 0x8c: case 0x8d: {  // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
        const uint64_t len = op == 'X' ? rd32(take(4)) : op == 0x8c ? *take(1) : rd64(take(8));
        auto v = make_value(Kind::kStr);
        v->s = take_str(len);
        push(v);
        break;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        const std::string module = take_line();
        push(find_global(module, take_line()));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const ValuePtr name = pop(), module = pop();
        if (name->kind != Kind::kStr || module->kind != Kind::kStr) fail("STACK_GLOBAL on non-str");
        push(find_global(module->s, name->s));
        break;
      }
      case 'Q': push(persistent_load(pop())); break;  // BINPERSID
      case 't': push(make_tuple(pop_mark())); break;  // TUPLE
      case 0x85: case 0x86: case 0x87: {              // TUPLE1..3
        std::vector<ValuePtr> items(static_cast<size_t>(op - 0x84));
        for (size_t k = items.size(); k-- > 0;) items[k] = pop();
        push(make_tuple(std::move(items)));
        break;
      }
      case 'J': push(make_value(Kind::kInt, static_cast<int32_t>(rd32(take(4))))); break;  // BININT
      case 'K': push(make_value(Kind::kInt, *take(1))); break;       // BININT1
      case 'M': push(make_value(Kind::kInt, rd16(take(2)))); break;  // BININT2
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        const uint8_t len = *take(1);
        if (len > 8) fail("LONG1 integer wider than 64 bits");
        const uint8_t* q = take(len);
        uint64_t u = 0;
        for (unsigned k = 0; k < len; ++k) u |= uint64_t{q[k]} << (8 * k);
        if (len > 0 && len < 8 && (q[len - 1] & 0x80)) u |= ~uint64_t{0} << (8 * len);
        push(make_value(Kind::kInt, static_cast<int64_t>(u)));
        break;
      }
      case 0x88: push(make_value(Kind::kBool, 1)); break;  // NEWTRUE
      case 0x89: push(make_value(Kind::kBool, 0)); break;  // NEWFALSE
      case 'N': push(make_value(Kind::kNone)); break;      // NONE
      case 'R': {                                          // REDUCE
        const ValuePtr args = pop();
        const ValuePtr fn = pop();
        push(reduce(fn, args));
        break;
      }
      case 's': {  // SETITEM
        const ValuePtr value = pop(), key = pop();
        set_item(top(), key, value);
        break;
      }
      case 'u': {  // SETITEMS
        const std::vector<ValuePtr> kv = pop_mark();
        if (kv.size() % 2) fail("SETITEMS with an odd number of items");
        const ValuePtr& dict = top();
        for (size_t k = 0; k < kv.size(); k += 2) set_item(dict, kv[k], kv[k + 1]);
        break;
      }
      case 'b': {  // BUILD: only the no-op state of an OrderedDict without attributes
        const ValuePtr state = pop();
        const bool empty_state = state->kind == Kind::kNone ||
                                 (state->kind == Kind::kDict && state->entries.empty());
        if (top()->kind != Kind::kDict || !empty_state) fail("unsupported BUILD (object state)");
        break;
      }
      case 'q': case 'r': case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
        const uint32_t idx = op == 'q' ? *take(1) : op == 'r' ? rd32(take(4))
                                                              : static_cast<uint32_t>(memo_.size());
        if (memo_.size() >= kMaxMemo && !memo_.count(idx)) fail("memo grows too large");
        memo_[idx] = top();
        break;
      }
      case 'h': case 'j': {  // BINGET, LONG_BINGET
        const uint32_t idx = op == 'h' ? *take(1) : rd32(take(4));
        const auto it = memo_.find(idx);
        if (it == memo_.end()) fail("memo index " + std::to_string(idx) + " is unset");
        push(it->second);
        break;
      }
      case '.':  // STOP
        if (!marks_.empty() || stack_.size() != 1) fail("STOP with a stack that is not one object");
        if (pos_ != n_) fail("bytes follow STOP");
        return stack_.back();
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", op);
        std::string name = hex;
        if (op >= 0x20 && op < 0x7f) name += std::string(" ('") + static_cast<char>(op) + "')";
        fail("unsupported pickle opcode " + name);
      }
    }
  }
}

}  // namespace

std::map<std::string, PtTensor> read_pt_tensors(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail(path, "cannot open: no such regular file");
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot stat: " + ec.message());
  if (size > kMaxFileBytes) fail(path, "file is larger than 4 GiB; Zip64 archives are not supported");
  std::vector<uint8_t> bytes(size);
  std::ifstream f(path, std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
    fail(path, "read error");
  }
  return read_pt_tensors_from_bytes(bytes.data(), bytes.size(), path);
}

std::map<std::string, PtTensor> read_pt_tensors_from_bytes(const uint8_t* data, size_t size,
                                                           const std::string& name) {
  Archive ar;
  ar.path = name;
  if (size > kMaxFileBytes) ar.fail("file is larger than 4 GiB; Zip64 archives are not supported");
  ar.bytes = data;
  ar.n_bytes = size;
  parse_zip(&ar);

  // The archive's folder: the one entry named "<prefix>/data.pkl" with a single-component prefix.
  std::string prefix;
  for (const auto& kv : ar.entries) {
    const std::string& entry = kv.first;
    const size_t slash = entry.find('/');
    if (slash == 0 || slash == std::string::npos) continue;
    if (entry.compare(slash, std::string::npos, "/data.pkl") != 0) continue;
    if (!prefix.empty()) ar.fail("archive holds several data.pkl entries");
    prefix = entry.substr(0, slash + 1);
  }
  if (prefix.empty()) ar.fail("archive has no <name>/data.pkl entry (not a torch.save file)");
  uint64_t n = 0;
  if (const uint8_t* bo = ar.read(prefix + "byteorder", &n)) {
    const std::string order(reinterpret_cast<const char*>(bo), n);
    if (order != "little") ar.fail("byte order is " + printable(order) + ", not 'little'");
  }
  const uint8_t* pkl = ar.read(prefix + "data.pkl", &n);
  if (n > kMaxPickleBytes) ar.fail("data.pkl is larger than 16 MiB");

  Unpickler unpickler(ar, prefix, pkl, n);
  const ValuePtr top = unpickler.run();
  if (top->kind != Kind::kDict) {
    ar.fail(std::string("top-level object is a ") + kind_name(top->kind) + ", not a dict");
  }
  // Tensors move out; one stored under several keys is copied from where it went first (each
  // copy was counted against kMaxMaterializedBytes by set_item).
  std::map<std::string, PtTensor> out;
  std::map<const Value*, std::string> moved;
  for (const auto& [key, value] : top->entries) {
    const auto [it, first] = moved.emplace(value.get(), key);
    out[key] = first ? std::move(value->tensor) : out.at(it->second);
  }
  return out;
}

}  // namespace ppx
