#include "ppx/resources.h"

#include "ppx/error.h"

extern const unsigned char ppx_res_config_7b[];
extern const unsigned long ppx_res_config_7b_size;
extern const unsigned char ppx_res_config_tiny_demo[];
extern const unsigned long ppx_res_config_tiny_demo_size;
extern const unsigned char ppx_res_tiny_spm[];
extern const unsigned long ppx_res_tiny_spm_size;

namespace ppx {
namespace {
std::string_view view(const unsigned char* p, unsigned long n) { return {reinterpret_cast<const char*>(p), n}; }
}  // namespace

std::string_view embedded_config(const std::string& name) {
  if (name == "personaplex-7b") return view(ppx_res_config_7b, ppx_res_config_7b_size);
  if (name == "tiny-demo") return view(ppx_res_config_tiny_demo, ppx_res_config_tiny_demo_size);
  throw Error("no embedded config '" + name + "' (have: personaplex-7b, tiny-demo)");
}

std::string_view embedded_tiny_tokenizer() { return view(ppx_res_tiny_spm, ppx_res_tiny_spm_size); }

}  // namespace ppx
