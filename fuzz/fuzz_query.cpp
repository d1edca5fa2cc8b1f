// libFuzzer target: the server's query-string helpers (src/server/http_util.h). The parsed map
// is dumped as JSON whenever is_valid_utf8 accepts every key and value, as the server does with
// client text: nlohmann::json throws on invalid UTF-8, so a throw here means is_valid_utf8
// accepted something it must not.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "server/http_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const std::string decoded = ppx::server::url_decode(in);
  if (decoded.size() > in.size()) std::abort();  // decoding never grows the text
  if (ppx::server::is_valid_utf8(decoded)) (void)nlohmann::json(decoded).dump();
  const auto query = ppx::server::parse_query(in);
  bool valid = true;
  for (const auto& [k, v] : query) {
    valid = valid && ppx::server::is_valid_utf8(k) && ppx::server::is_valid_utf8(v);
  }
  if (valid) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : query) j[k] = v;
    (void)j.dump();  // throws (uncaught: a crash) on invalid UTF-8
  }
  return 0;
}
