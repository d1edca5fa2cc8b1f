// Helpers of the HTTP/WebSocket front end that need no network: query-string parsing (form
// encoding), UTF-8 validation, the voice allow-list and safe static-file lookup.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ppx::server {

// Decodes %XX escapes and '+' (a space, as URLSearchParams writes it). A malformed escape is kept
// as literal text.
std::string url_decode(const std::string& s);

// Splits "a=1&b=x+y" into decoded key/value pairs (the last value of a repeated key wins).
std::map<std::string, std::string> parse_query(const std::string& query);

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(const std::string& s);

// The voice files of `dir`: names of regular files (symlinks excluded) ending in .pt or .wav
// that are valid UTF-8, sorted. Empty when dir is empty or unreadable.
std::vector<std::string> list_voices(const std::string& dir);

// Full path of the voice `name` when it is a plain file name listed by list_voices(dir), else
// nullopt (so "../x", "/etc/passwd", "a/b.pt" and unlisted names are all refused).
std::optional<std::string> resolve_voice(const std::string& dir, const std::string& name);

// The regular file under `root` that the URL path `target` names ("/" -> index.html), or nullopt
// when it does not exist or would leave `root` (".." segments, symlinks pointing outside).
std::optional<std::string> resolve_static(const std::string& root, const std::string& target);

// A MIME type from a file name's extension (application/octet-stream when unknown).
std::string content_type(const std::string& path);

// A Sec-WebSocket-Key as RFC 6455 has it: 16 bytes in base64 (22 characters of the alphabet, the
// last with no bits past the 16 bytes, then "==").
bool valid_websocket_key(std::string_view key);

// The subprotocols a Sec-WebSocket-Protocol header offers: its comma-separated tokens, without
// the white space around them, empty ones left out (RFC 6455 4.1).
std::vector<std::string> websocket_protocols(std::string_view header);

}  // namespace ppx::server
