#include "server/web_assets.h"

#include <array>
#include <utility>

extern const unsigned char ppx_res_web_index[];
extern const unsigned long ppx_res_web_index_size;
extern const unsigned char ppx_res_web_app[];
extern const unsigned long ppx_res_web_app_size;
extern const unsigned char ppx_res_web_ogg[];
extern const unsigned long ppx_res_web_ogg_size;
extern const unsigned char ppx_res_web_worklet[];
extern const unsigned long ppx_res_web_worklet_size;

namespace ppx::server {
namespace {

std::string_view view(const unsigned char* p, unsigned long n) {
  return {reinterpret_cast<const char*>(p), n};
}

}  // namespace

const WebAsset* find_web_asset(const std::string& path) {
  static const std::array<std::pair<const char*, WebAsset>, 5> assets = {{
      {"/", {view(ppx_res_web_index, ppx_res_web_index_size), "text/html; charset=utf-8"}},
      {"/index.html", {view(ppx_res_web_index, ppx_res_web_index_size), "text/html; charset=utf-8"}},
      {"/app.js", {view(ppx_res_web_app, ppx_res_web_app_size), "text/javascript; charset=utf-8"}},
      {"/ogg.js", {view(ppx_res_web_ogg, ppx_res_web_ogg_size), "text/javascript; charset=utf-8"}},
      {"/capture-worklet.js",
       {view(ppx_res_web_worklet, ppx_res_web_worklet_size), "text/javascript; charset=utf-8"}},
  }};
  for (const auto& [p, a] : assets)
    if (path == p) return &a;
  return nullptr;
}

}  // namespace ppx::server
