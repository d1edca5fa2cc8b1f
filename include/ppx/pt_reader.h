// Safe reader for PyTorch `torch.save` archives holding a dict of tensors (voice prompt files).
//
// A `torch.save` file is a zip archive (stored entries, one top-level folder `<prefix>/`) holding
// `data.pkl`, a pickle, and one entry `data/<key>` per storage. The pickle is interpreted by a
// small stack machine that knows only the opcodes torch emits and only an allowlist of globals:
// `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2` and the typed storage classes
// `torch.{Float,Half,BFloat16,Long,Int,Byte,Bool}Storage`. Nothing is imported, called or executed;
// any other global, opcode or structure is refused with a ppx::Error naming the file.
//
// Storage locations (`cpu`, `cuda:0`, ...) are ignored: the bytes are read from the archive, so no
// GPU is needed. Every zip offset and size, storage size, tensor offset and stride is checked
// before use. Limits against hostile files (real voice prompts, a few MiB, are far below all):
//  - zip: every entry's bytes, from its local header to the end of its data, must be disjoint
//    from every other entry's (so no byte is read through two entries); the CRC32 of every entry
//    read is verified, once, and at most 1 GiB is checksummed in all.
//  - pickle: at most 16 MiB; stack, memo, tuple and nesting sizes are capped so a hostile file
//    cannot exhaust memory or the call stack.
//  - tensors: at most 2^28 elements per storage and per tensor, and at most 256 MiB of returned
//    tensor data in all (4 bytes per float element, 8 per integer element), counted before
//    anything is allocated. Stride-0 views can expand a small storage up to that, and a tensor
//    stored under several dict keys is returned (and counted) once per key.
// Zip64 archives (those that actually need Zip64 fields) and compressed entries are refused.
// Little-endian hosts only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ppx/dtype.h"

namespace ppx {

struct PtTensor {
  DType dtype;                 // storage dtype as saved
  std::vector<int64_t> shape;  // sizes, outermost first; data below is contiguous row-major
  std::vector<float> f32;      // filled for F32/F16/BF16 (exact conversion); empty otherwise
  std::vector<int64_t> i64;    // filled for I64/I32/U8/Bool (Bool as 0/1); empty otherwise
};

// Reads a torch.save archive whose top-level pickle object is a dict or collections.OrderedDict
// mapping str -> tensor. Tensors are gathered from their storage honoring storage offset and
// strides. Throws ppx::Error naming the file and what was unexpected.
std::map<std::string, PtTensor> read_pt_tensors(const std::string& path);

// The same from the `size` bytes at `data` (the whole file, in memory); error messages name the
// archive `name`. read_pt_tensors reads the file and calls this.
std::map<std::string, PtTensor> read_pt_tensors_from_bytes(const uint8_t* data, size_t size,
                                                           const std::string& name);

}  // namespace ppx
