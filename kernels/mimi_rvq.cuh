// Host launchers of Mimi's split residual vector quantizer (fp32), batched over stream slots.
//
// Encode: rvq_project computes the semantic input P_first z and the acoustic residual P_rest z of the
// same latent z; rvq_search then finds, codebook by codebook, argmin_j |x - e_j| with
// d^2 = |x|^2 - 2 x.e_j + |e_j|^2 clamped at 0 and ties going to the lowest index (the minimum of
// (sqrt(d^2) bits << 32 | j) over all blocks through atomicMin). Codebook 0 (semantic) and 1 (first
// acoustic) search in one launch; each later acoustic codebook needs the previous code, so it is a
// launch of its own, which first forms its residual r_k = r_{k-1} - e_{k-1}[c_{k-1}].
// Decode: z = O_first e_0[c_0] + O_rest (e_1[c_1] + ... + e_{n-1}[c_{n-1}]), fused with the depthwise
// transposed-conv upsampler (kernel 2S, stride S, no bias) that turns z into S tokens.
#pragma once

#include <cuda_runtime.h>

#include "mimi_types.cuh"

namespace ppx::kern::mimi {

struct RvqEncodeParams {
  const float* proj = nullptr;   // [2 * dim][in_dim]: rows [0, dim) P_first, [dim, 2 dim) P_rest
  const float* books = nullptr;  // [ncb][bins][dim] codebook vectors
  const float* norms = nullptr;  // [ncb][bins] |e|^2
  int in_dim = 0, dim = 0, bins = 0, ncb = 0;  // in_dim and dim multiples of 4
  Act z;                         // latent, element (i, 0), i < in_dim
  float* resid = nullptr;        // per slot [ncb][dim]: the vector searched in codebook k
  long long resid_stride = 0;
  int* state = nullptr;          // per slot ints: [0, ncb) done counters, [ncb, 2 ncb) codes
  int state_stride = 0;
  unsigned long long* cells = nullptr;  // per slot [ncb] packed minima
  int cells_stride = 0;
  int* codes_out = nullptr;      // [B][ncb] (indexed by batch row), int32
  SlotInt advance;               // incremented once per slot by the last search launch
};

// grid (ceil(2 dim / 4), B), 128 threads. Also re-arms the search counters of the slot.
void rvq_project(const RvqEncodeParams& p, const Batch& batch, cudaStream_t s);
// Searches codebooks [first, first + count); `last` marks the final launch of the encode.
void rvq_search(const RvqEncodeParams& p, int first, int count, bool last, const Batch& batch, cudaStream_t s);

struct RvqDecodeParams {
  const int* codes = nullptr;    // [B][ncb] (indexed by batch row), clamped into [0, bins)
  const float* books = nullptr;  // [ncb][bins][dim]
  int dim = 0, bins = 0, ncb = 0, out_dim = 0;  // dim multiple of 4
  const float* out_first = nullptr;  // [out_dim][dim]
  const float* out_rest = nullptr;   // [out_dim][dim]
  const float* up_w = nullptr;       // [out_dim][2 * stride] depthwise upsampler
  int stride = 0;                    // upsampling factor = output tokens
  float* zprev = nullptr;            // per slot [out_dim]: the previous call's latent
  long long zprev_stride = 0;
  SlotInt frame;                     // decoder calls since reset (read only)
  Act y;                             // output element (c, t), c < out_dim, t < stride
};

// grid (ceil(out_dim / 4), B), 128 threads.
void rvq_decode_upsample(const RvqDecodeParams& p, const Batch& batch, cudaStream_t s);

}  // namespace ppx::kern::mimi
