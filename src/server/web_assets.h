// The web client (src/server/web/: plain HTML and JavaScript, no build step), compiled into the
// server so that GET / works without any install step.
#pragma once

#include <string>
#include <string_view>

namespace ppx::server {

struct WebAsset {
  std::string_view body;
  const char* content_type;
};

// The client file that the URL path `path` names ("/" is index.html), or nullptr.
const WebAsset* find_web_asset(const std::string& path);

}  // namespace ppx::server
