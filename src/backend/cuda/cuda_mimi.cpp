// CudaMimi: plan building (weights, per-slot layouts) and the launch sequences of encode/decode.
//
// Per direction (encoder, decoder) each slot owns two regions: `state` (conv histories in two
// parities, transposed-conv input carries, the upsampler's previous latent, the KV rings) and `acts`
// (every intermediate activation, one buffer per layer output, so nothing is aliased). Per slot there
// are also a few ints (frame counters, RVQ counters and codes) and the RVQ argmin cells. A reset only
// zeroes the frame counter: kernels treat the first call after a reset as "no history" by looking at
// it, so stale history, carries and ring contents are never read.
#include "backend/cuda/cuda_mimi.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu_ops.h"
#include "backend/cuda/cuda_util.h"
#include "mimi_attention.cuh"
#include "mimi_conv.cuh"
#include "mimi_linear.cuh"
#include "mimi_rvq.cuh"
#include "ppx/error.h"
#include "ppx/weights.h"

namespace ppx::cuda {

namespace km = ppx::kern::mimi;

namespace {

// Per-slot layout: offsets in floats, each region 64-float (256-byte) aligned.
struct Arena {
  size_t floats = 0;
  long long take(size_t n) {
    const size_t o = floats;
    floats += (n + 63) / 64 * 64;
    return static_cast<long long>(o);
  }
};

// An activation tensor of one slot: [c, t] channel-major, or [t, c] token-major.
struct Buf {
  long long off = -1;  // -1: none; -2: the caller's buffer (patched per call)
  int c = 0, t = 0;
  bool token_major = false;
};

struct Conv {
  km::ConvParams p;
  bool gemv = false;
  bool mma = false;  // --mimi-fp16: conv_mma with p.w16
  // set_mimi_blas_rows: a short (gemv) conv's fp32 weights in conv_mma's [rows][k] order, unpadded,
  // for conv_im2col + cuBLAS + conv_gemm_epilogue.
  const float* wg = nullptr;
  Buf x, residual, raw, elu;
  long long hist_off = 0;
};

struct TrLayer {
  const float *in_proj, *out_proj, *norm1_w, *norm1_b, *norm2_w, *norm2_b, *linear1, *linear2, *ls1, *ls2;
  long long k_off, v_off;  // state arena: [capacity][d_model] each
  // --mimi-fp16: the fp16 weights of in_proj, out_proj, linear1, linear2 (conv_mma's layout).
  const void* w16[4] = {nullptr, nullptr, nullptr, nullptr};
};

// The workspace of each direction's cuBLAS handle (set_mimi_blas_rows).
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

// A cuBLAS handle with its own workspace (set_mimi_blas_rows): one per direction, so the encoder and
// the decoder may run on two streams at once.
class Blas {
 public:
  Blas() = default;
  ~Blas() {
    if (h_) cublasDestroy(h_);
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  void create(size_t workspace_bytes) {
    const cublasStatus_t st = cublasCreate(&h_);
    if (st != CUBLAS_STATUS_SUCCESS) {
      h_ = nullptr;
      throw Error(std::string("CudaMimi: cublasCreate failed: ") + cublasGetStatusString(st));
    }
    ws_.resize(workspace_bytes);
  }
  // C [n][m] = B [n][k] . A [m][k]^T (row-major fp32 A, B, C; TF32 tensor cores, fp32 sums), on s.
  void gemm_tf32(int m, int n, int k, const float* a, const float* b, float* c, cudaStream_t s) const {
    const float one = 1.f, zero = 0.f;
    check(cublasSetStream(h_, s), "cublasSetStream");
    // After cublasSetStream, which falls back to the default workspace: ours again (graph capture).
    check(cublasSetWorkspace(h_, ws_.get(), ws_.bytes()), "cublasSetWorkspace");
    check(cublasGemmEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_32F, k, b, CUDA_R_32F, k, &zero, c,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }

 private:
  static void check(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(std::string("CudaMimi: ") + what + ": " + cublasGetStatusString(st));
  }
  cublasHandle_t h_ = nullptr;
  DeviceBuffer<unsigned char> ws_;
};

struct Direction {
  Arena state_layout, act_layout;
  DeviceBuffer<float> state, acts;
  std::vector<Conv> convs;
  std::vector<TrLayer> layers;
  Buf x, qkv, att, ff;  // transformer activations, token-major
  Buf xn;               // --mimi-fp16: the LayerNorm'd x of a linear run as conv_mma
  km::SlotInt frame;
  // set_mimi_blas_rows: the linears' contiguous input [slots][tokens][widest input] and product
  // [slots][tokens][widest output] for cuBLAS, and the handle.
  Blas blas;
  DeviceBuffer<float> blas_x, blas_y;
};

std::atomic<int> g_blas_rows{kDefaultMimiBlasRows};  // set_mimi_blas_rows

}  // namespace

struct CudaMimi::Impl {
  MimiConfig c;
  int slots = 0;
  bool pdl = true;
  bool fp16 = false;
  bool mma_always = false;  // set_mma_always
  int blas_rows = 0;        // set_mimi_blas_rows when built (fp16 only; 0: off)
  int tokens = 0;  // 25 Hz latents per frame (encoder_stride)
  std::vector<DeviceBuffer<float>> weights;
  std::vector<DeviceBuffer<__half>> weights16;
  size_t weight_floats = 0, weight_halves = 0;
  DeviceBuffer<int> slot_ids;
  DeviceBuffer<int> ints;  // per slot [ints_stride]: enc frame, dec frame, dec done, -, rvq done[ncb], codes[ncb]
  int ints_stride = 0;
  DeviceBuffer<unsigned long long> cells;  // per slot [ncb]
  DeviceBuffer<float> omega;
  Direction enc, dec;
  Conv down;
  Buf z, resid;          // encoder acts: downsampled latent [D], RVQ search vectors [ncb][dim]
  long long zprev_off = 0;  // decoder state: upsampler's previous latent [D]
  const float *proj = nullptr, *books = nullptr, *norms = nullptr, *out_first = nullptr, *out_rest = nullptr,
              *up_w = nullptr;

  // fp16 [rows][kpad] of row-major fp32 [rows][k] (kpad >= k, zero-filled), for conv_mma.
  const void* upload16(const std::vector<float>& v, int rows, int k, int kpad) {
    std::vector<__half> h(static_cast<size_t>(rows) * kpad, __float2half_rn(0.f));
    for (int r = 0; r < rows; ++r)
      for (int q = 0; q < k; ++q)
        h[static_cast<size_t>(r) * kpad + q] =
            __float2half_rn(std::clamp(v[static_cast<size_t>(r) * k + q], -65504.f, 65504.f));
    weights16.emplace_back(h.size());
    PPX_CUDA_CHECK(cudaMemcpy(weights16.back().get(), h.data(), h.size() * sizeof(__half), cudaMemcpyHostToDevice));
    weight_halves += h.size();
    return weights16.back().get();
  }

  const float* upload(const std::vector<float>& v) {
    weights.emplace_back(v.size());
    PPX_CUDA_CHECK(cudaMemcpy(weights.back().get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    weight_floats += v.size();
    return weights.back().get();
  }

  Buf buf(Direction& d, int ch, int t, bool token_major = false) {
    return Buf{d.act_layout.take(static_cast<size_t>(ch) * t), ch, t, token_major};
  }

  // Loads one streaming conv (or transposed conv) and lays out its history. `x` is its input.
  Conv& add_conv(Direction& d, WeightSource& w, const std::string& key, int cin, int cout, int k, int s,
                 bool transposed, bool bias, bool replicate, const Buf& x) {
    if (k < s) throw Error("mimi conv '" + key + "': kernel smaller than stride");
    if (transposed && k != 2 * s) throw Error("mimi convtr '" + key + "': CUDA path needs kernel == 2 * stride");
    const int t_in = x.t;
    if (!transposed && t_in % s != 0) throw Error("mimi conv '" + key + "': chunk not a multiple of the stride");
    const std::vector<float> wt =
        transposed ? w.load(key + ".weight", {cin, cout, k}) : w.load(key + ".weight", {cout, cin, k});
    Conv cv;
    km::ConvParams& p = cv.p;
    p.cin = cin;
    p.cout = cout;
    p.kernel = k;
    p.stride = s;
    p.t_in = t_in;
    p.transposed = transposed ? 1 : 0;
    p.replicate = replicate ? 1 : 0;
    const int nv = transposed ? t_in : t_in / s;
    cv.gemv = nv <= 16 && cin % 4 == 0 && k <= 32;
    // Element (o, i, j) of the stored tensor.
    auto at = [&](int o, int i, int j) {
      return transposed ? wt[(static_cast<size_t>(i) * cout + o) * k + j] : wt[(static_cast<size_t>(o) * cin + i) * k + j];
    };
    std::vector<float> dev(wt.size());
    for (int o = 0; o < cout; ++o)
      for (int i = 0; i < cin; ++i)
        for (int j = 0; j < k; ++j) {
          const size_t dst = cv.gemv ? ((static_cast<size_t>(o) * (cin / 4) + i / 4) * k + j) * 4 + i % 4
                                     : (static_cast<size_t>(o) * cin + i) * k + j;
          dev[dst] = at(o, i, j);
        }
    p.w = upload(dev);
    // --mimi-fp16: the long convs (and the transposed ones) also as conv_mma's fp16 [rows][kpad]
    // (the frame-advancing last conv, with one output channel, stays fp32; see finalize); with
    // set_mimi_blas_rows the short ones also in fp32 in the same order, for cuBLAS.
    const bool blas = blas_rows > 0 && cv.gemv && cout >= 16;
    if ((fp16 && !cv.gemv && cout >= 16) || blas) {
      const int taps = transposed ? 2 : k, kred = cin * taps, rows = km::conv_mma_rows(p);
      std::vector<float> g(static_cast<size_t>(rows) * kred);
      for (int row = 0; row < rows; ++row) {
        const int r = transposed ? row / cout : 0, o = row - r * cout;
        for (int q = 0; q < kred; ++q) {
          const int i = q / taps, j = q - i * taps;
          g[static_cast<size_t>(row) * kred + q] = at(o, i, transposed ? r + j * s : j);
        }
      }
      if (blas) {
        cv.wg = upload(g);
      } else {
        p.w16 = upload16(g, rows, kred, km::conv_mma_kpad(p));
        cv.mma = true;
      }
    }
    if (bias) p.bias = upload(w.load(key + ".bias", {cout}));
    if (cv.gemv && !km::conv_gemv_supported(p)) throw Error("mimi conv '" + key + "': unsupported GEMV shape");
    cv.x = x;
    cv.hist_off = d.state_layout.take(2 * static_cast<size_t>(cin) * km::conv_ctx(p));
    p.frame = d.frame;
    d.convs.push_back(cv);
    return d.convs.back();
  }

  void build_seanet_encoder(WeightSource& w);
  void build_seanet_decoder(WeightSource& w);
  void build_transformer(Direction& d, WeightSource& w, const std::string& prefix);
  void build_quantizer(WeightSource& w);
  void finalize(Direction& d);
  void run_conv(const Direction& d, const Conv& cv, const km::ConvParams& p, const km::Batch& bt,
                cudaStream_t s) const;
  void run_convs(const Direction& d, const km::Batch& bt, const float* user_in, float* user_out, cudaStream_t s) const;
  void run_transformer(const Direction& d, const km::Batch& bt, cudaStream_t s) const;
  enum class LinearPath { kGemv, kMma, kBlas };
  void run_linear(const Direction& d, const km::LinearParams& lp, const void* w16, LinearPath path,
                  const km::Batch& bt, cudaStream_t s) const;
  void encode(const km::Batch& bt, const float* d_pcm, int32_t* d_codes, cudaStream_t s) const;
  void decode(const km::Batch& bt, const int32_t* d_codes, float* d_pcm, cudaStream_t s) const;
};

namespace {

km::Act act_of(const Buf& b, float* base, size_t per_slot) {
  km::Act a;
  a.p = b.off >= 0 ? base + b.off : nullptr;
  a.row_stride = static_cast<long long>(per_slot);
  a.by_slot = 1;
  a.sc = b.token_major ? 1 : b.t;
  a.st = b.token_major ? b.c : 1;
  return a;
}

}  // namespace

void CudaMimi::Impl::build_seanet_encoder(WeightSource& w) {
  const SeanetConfig& sc = c.seanet;
  const int n = static_cast<int>(sc.ratios.size()), nf = sc.n_filters;
  auto key = [](int idx) { return "encoder.model." + std::to_string(idx); };
  int T = c.frame_samples();
  Buf pcm{-2, sc.channels, T, false};
  Buf raw = buf(enc, nf, T), elu = buf(enc, nf, T);
  Conv& c0 = add_conv(enc, w, key(0) + ".conv.conv", sc.channels, nf, sc.kernel_size, 1, false, true, false, pcm);
  c0.raw = raw;
  c0.elu = elu;
  int idx = 1, mult = 1;
  for (int i = n - 1; i >= 0; --i) {
    const int r = sc.ratios[i], dim = mult * nf, hidden = dim / sc.compress;
    // Residual block: e = elu(raw + conv2(elu(conv1(elu(raw))))), the ELU being the next layer's.
    const Buf h = buf(enc, hidden, T), e = buf(enc, dim, T);
    add_conv(enc, w, key(idx) + ".block.1.conv.conv", dim, hidden, sc.residual_kernel_size, 1, false, true, false, elu)
        .elu = h;
    Conv& c2 = add_conv(enc, w, key(idx) + ".block.3.conv.conv", hidden, dim, 1, 1, false, true, false, h);
    c2.residual = raw;
    c2.elu = e;
    idx += 2;  // the block and the ELU
    const int t_out = T / r;
    raw = i > 0 ? buf(enc, 2 * dim, t_out) : Buf{};
    elu = buf(enc, 2 * dim, t_out);
    Conv& cs = add_conv(enc, w, key(idx) + ".conv.conv", dim, 2 * dim, 2 * r, r, false, true, false, e);
    cs.raw = raw;
    cs.elu = elu;
    ++idx;
    T = t_out;
    mult *= 2;
  }
  enc.x = buf(enc, sc.dimension, T, true);
  add_conv(enc, w, key(idx + 1) + ".conv.conv", mult * nf, sc.dimension, sc.last_kernel_size, 1, false, true, false,
           elu)
      .raw = enc.x;
}

void CudaMimi::Impl::build_seanet_decoder(WeightSource& w) {
  const SeanetConfig& sc = c.seanet;
  const int n = static_cast<int>(sc.ratios.size()), nf = sc.n_filters;
  auto key = [](int idx) { return "decoder.model." + std::to_string(idx); };
  int T = tokens, mult = 1 << n;
  dec.x = buf(dec, sc.dimension, T, true);
  Buf elu = buf(dec, mult * nf, T);
  add_conv(dec, w, key(0) + ".conv.conv", sc.dimension, mult * nf, sc.kernel_size, 1, false, true, false, dec.x).elu =
      elu;
  int idx = 2;  // after the ELU
  for (int i = 0; i < n; ++i) {
    const int r = sc.ratios[i], dim = mult * nf / 2, hidden = dim / sc.compress, t_out = T * r;
    const Buf raw = buf(dec, dim, t_out), e1 = buf(dec, dim, t_out);
    Conv& ct = add_conv(dec, w, key(idx) + ".convtr.convtr", mult * nf, dim, 2 * r, r, true, true, false, elu);
    ct.raw = raw;
    ct.elu = e1;
    ++idx;
    const Buf h = buf(dec, hidden, t_out), e = buf(dec, dim, t_out);
    add_conv(dec, w, key(idx) + ".block.1.conv.conv", dim, hidden, sc.residual_kernel_size, 1, false, true, false, e1)
        .elu = h;
    Conv& c2 = add_conv(dec, w, key(idx) + ".block.3.conv.conv", hidden, dim, 1, 1, false, true, false, h);
    c2.residual = raw;
    c2.elu = e;
    idx += 2;  // the block and the next ELU
    elu = e;
    T = t_out;
    mult /= 2;
  }
  Conv& last =
      add_conv(dec, w, key(idx) + ".conv.conv", nf, sc.channels, sc.last_kernel_size, 1, false, true, false, elu);
  last.raw = Buf{-2, sc.channels, T, false};
}

void CudaMimi::Impl::build_transformer(Direction& d, WeightSource& w, const std::string& prefix) {
  const MimiTransformerConfig& tc = c.transformer;
  const int D = tc.d_model, F = tc.dim_feedforward;
  for (int i = 0; i < tc.num_layers; ++i) {
    const std::string k = prefix + "layers." + std::to_string(i) + ".";
    TrLayer l{};
    const std::vector<float> in_proj = w.load(k + "self_attn.in_proj_weight", {3 * D, D});
    const std::vector<float> out_proj = w.load(k + "self_attn.out_proj.weight", {D, D});
    l.in_proj = upload(in_proj);
    l.out_proj = upload(out_proj);
    l.norm1_w = upload(w.load(k + "norm1.weight", {D}));
    l.norm1_b = upload(w.load(k + "norm1.bias", {D}));
    l.norm2_w = upload(w.load(k + "norm2.weight", {D}));
    l.norm2_b = upload(w.load(k + "norm2.bias", {D}));
    const std::vector<float> linear1 = w.load(k + "linear1.weight", {F, D});
    const std::vector<float> linear2 = w.load(k + "linear2.weight", {D, F});
    l.linear1 = upload(linear1);
    l.linear2 = upload(linear2);
    if (fp16) {  // din is a multiple of 128 (linear_supported), so kpad = din
      l.w16[0] = upload16(in_proj, 3 * D, D, D);
      l.w16[1] = upload16(out_proj, D, D, D);
      l.w16[2] = upload16(linear1, F, D, D);
      l.w16[3] = upload16(linear2, D, F, F);
    }
    l.ls1 = upload(w.load(k + "layer_scale_1.scale", {D}));
    l.ls2 = upload(w.load(k + "layer_scale_2.scale", {D}));
    l.k_off = d.state_layout.take(static_cast<size_t>(tc.context) * D);
    l.v_off = d.state_layout.take(static_cast<size_t>(tc.context) * D);
    d.layers.push_back(l);
  }
  d.qkv = buf(d, 3 * D, tokens, true);
  d.att = buf(d, D, tokens, true);
  d.ff = buf(d, F, tokens, true);
  if (fp16) d.xn = buf(d, D, tokens, true);
}

void CudaMimi::Impl::build_quantizer(WeightSource& w) {
  const QuantizerConfig& q = c.quantizer;
  const int D = q.dimension, B = q.bins, ncb = c.num_codebooks;
  std::vector<float> books_h, norms_h;
  auto load_book = [&](const std::string& prefix, bool used) {
    const std::string k = prefix + "._codebook.";
    w.require(k + "_initialized", {1});
    if (!used) {
      w.require(k + "cluster_usage", {B});
      w.require(k + "embedding_sum", {B, D});
      return;
    }
    const std::vector<float> usage = w.load(k + "cluster_usage", {B});
    const std::vector<float> sum = w.load(k + "embedding_sum", {B, D});
    const size_t base = books_h.size();
    books_h.resize(base + sum.size());
    for (int b = 0; b < B; ++b) {
      const float u = std::max(usage[b], 1e-5f);
      float* e = books_h.data() + base + static_cast<size_t>(b) * D;
      for (int d = 0; d < D; ++d) e[d] = sum[static_cast<size_t>(b) * D + d] / u;
      norms_h.push_back(cpu::dot(e, e, D));
    }
  };
  std::vector<float> proj_h = w.load("quantizer.rvq_first.input_proj.weight", {D, q.input_dimension, 1});
  out_first = upload(w.load("quantizer.rvq_first.output_proj.weight", {q.output_dimension, D, 1}));
  load_book("quantizer.rvq_first.vq.layers.0", true);
  const std::vector<float> in_rest = w.load("quantizer.rvq_rest.input_proj.weight", {D, q.input_dimension, 1});
  proj_h.insert(proj_h.end(), in_rest.begin(), in_rest.end());
  out_rest = upload(w.load("quantizer.rvq_rest.output_proj.weight", {q.output_dimension, D, 1}));
  for (int k = 0; k < q.n_q - 1; ++k) load_book("quantizer.rvq_rest.vq.layers." + std::to_string(k), k < ncb - 1);
  proj = upload(proj_h);
  books = upload(books_h);
  norms = upload(norms_h);
}

void CudaMimi::Impl::finalize(Direction& d) {
  d.state.resize(d.state_layout.floats * slots);
  d.acts.resize(d.act_layout.floats * slots);
  d.state.zero();
  d.acts.zero();
  for (Conv& cv : d.convs) {
    km::ConvParams& p = cv.p;
    p.x = act_of(cv.x, d.acts.get(), d.act_layout.floats);
    p.residual = act_of(cv.residual, d.acts.get(), d.act_layout.floats);
    p.out_raw = act_of(cv.raw, d.acts.get(), d.act_layout.floats);
    p.out_elu = act_of(cv.elu, d.acts.get(), d.act_layout.floats);
    p.hist = d.state.get() + cv.hist_off;
    p.hist_stride = static_cast<long long>(d.state_layout.floats);
  }
}

CudaMimi::CudaMimi(const MimiConfig& c, WeightSource& w, int slots, bool pdl, bool fp16)
    : p_(std::make_unique<Impl>()) {
  Impl& m = *p_;
  m.c = c;
  m.slots = slots;
  m.pdl = pdl;
  m.fp16 = fp16;
  m.blas_rows = fp16 ? g_blas_rows.load() : 0;
  m.tokens = c.encoder_stride();
  if (slots < 1) throw Error("CudaMimi: slots must be >= 1");
  const MimiTransformerConfig& tc = c.transformer;
  const QuantizerConfig& q = c.quantizer;
  const int ncb = c.num_codebooks;
  if (!km::linear_supported(tc.d_model, m.tokens) || !km::linear_supported(tc.dim_feedforward, m.tokens) ||
      !km::linear_supported(q.input_dimension, 1))
    throw Error("CudaMimi: transformer/quantizer widths must be multiples of 128 up to 2048, 1 or 2 tokens a frame");
  const int head_dim = tc.d_model / tc.num_heads;
  if ((head_dim != 32 && head_dim != 64 && head_dim != 128) || q.dimension % 4 != 0 || q.dimension > 512 ||
      q.input_dimension > 512 || ncb < 1 || ncb > q.n_q)
    throw Error("CudaMimi: head dim must be 32, 64 or 128; codebook dims multiples of 4 up to 512");
  if (q.input_dimension != c.seanet.dimension || q.output_dimension != c.seanet.dimension || tc.d_model != c.seanet.dimension)
    throw Error("CudaMimi: quantizer/transformer widths must equal the SEANet dimension");

  m.ints_stride = 4 + 2 * ncb;
  m.ints.resize(static_cast<size_t>(slots) * m.ints_stride);
  m.ints.zero();
  m.cells.resize(static_cast<size_t>(slots) * ncb);
  m.enc.frame = km::SlotInt{m.ints.get() + 0, m.ints_stride};
  m.dec.frame = km::SlotInt{m.ints.get() + 1, m.ints_stride};
  std::vector<int> ids(slots);
  for (int i = 0; i < slots; ++i) ids[i] = i;
  m.slot_ids.resize(slots);
  m.slot_ids.upload(ids.data(), ids.size());

  // Same construction order as ppx::Mimi (encoder, decoder, transformers, resamplers, quantizer).
  m.build_seanet_encoder(w);
  m.build_seanet_decoder(w);
  m.build_transformer(m.enc, w, "encoder_transformer.transformer.");
  m.build_transformer(m.dec, w, "decoder_transformer.transformer.");
  const int D = c.seanet.dimension, S = c.encoder_stride();
  {
    const size_t before = m.enc.convs.size();
    m.add_conv(m.enc, w, "downsample.conv.conv.conv", D, D, 2 * S, S, false, false, true, m.enc.x);
    m.down = m.enc.convs.back();
    m.enc.convs.resize(before);  // launched separately, after the transformer
    m.z = m.buf(m.enc, D, 1);
    m.down.raw = m.z;
  }
  m.up_w = m.upload(w.load("upsample.convtr.convtr.convtr.weight", {D, 1, 2 * S}));
  m.zprev_off = m.dec.state_layout.take(D);
  m.build_quantizer(w);
  m.resid = m.buf(m.enc, q.dimension, ncb);

  // RoPE frequencies exactly as cpu::rope_inplace forms them (max_period passes through fp32).
  const int hd = tc.d_model / tc.num_heads;
  const double maxp = static_cast<double>(static_cast<float>(tc.max_period));
  const float cexp = static_cast<float>(-std::log(maxp) * 2.0 / static_cast<double>(hd));
  std::vector<float> om(hd / 2);
  for (int i = 0; i < hd / 2; ++i) om[i] = std::exp(static_cast<float>(i) * cexp);
  m.omega.resize(om.size());
  m.omega.upload(om.data(), om.size());

  m.finalize(m.enc);
  m.finalize(m.dec);
  km::ConvParams& dp = m.down.p;
  dp.x = act_of(m.down.x, m.enc.acts.get(), m.enc.act_layout.floats);
  dp.out_raw = act_of(m.down.raw, m.enc.acts.get(), m.enc.act_layout.floats);
  dp.hist = m.enc.state.get() + m.down.hist_off;
  dp.hist_stride = static_cast<long long>(m.enc.state_layout.floats);
  // The decoder's last conv advances the decoder frame counter once all its blocks are done.
  km::ConvParams& lp = m.dec.convs.back().p;
  lp.done = km::SlotInt{m.ints.get() + 2, m.ints_stride};
  lp.advance = m.dec.frame;
  for (Direction* d : {&m.enc, &m.dec})
    for (Conv& cv : d->convs) cv.mma = cv.mma && km::conv_mma_supported(cv.p);
  m.down.mma = m.down.mma && km::conv_mma_supported(m.down.p);

  if (m.blas_rows > 0) {
    // Per row: the linears' input and product, and each short conv's columns and product.
    const int F = tc.dim_feedforward, W = tc.d_model;
    for (Direction* d : {&m.enc, &m.dec}) {
      size_t x_row = static_cast<size_t>(m.tokens) * std::max(W, F);
      size_t y_row = static_cast<size_t>(m.tokens) * std::max(3 * W, F);
      std::vector<const Conv*> convs;
      for (const Conv& cv : d->convs) convs.push_back(&cv);
      if (d == &m.enc) convs.push_back(&m.down);
      for (const Conv* cv : convs) {
        if (!cv->wg) continue;
        if (!km::conv_mma_supported(cv->p)) throw Error("CudaMimi: a short conv's shape has no GEMM form");
        const size_t cols = static_cast<size_t>(km::conv_gemm_cols(cv->p));
        x_row = std::max(x_row, cols * static_cast<size_t>(km::conv_gemm_k(cv->p)));
        y_row = std::max(y_row, cols * static_cast<size_t>(km::conv_mma_rows(cv->p)));
      }
      d->blas.create(kBlasWorkspaceBytes);
      d->blas_x.resize(static_cast<size_t>(slots) * x_row);
      d->blas_y.resize(static_cast<size_t>(slots) * y_row);
    }
  }

  size_t smem = 0;
  for (const Direction* d : {&m.enc, &m.dec})
    for (const Conv& cv : d->convs)
      if (cv.gemv) smem = std::max(smem, km::conv_gemv_smem_bytes(cv.p));
  if (m.down.gemv) smem = std::max(smem, km::conv_gemv_smem_bytes(m.down.p));
  int dev = 0, optin = 0;
  PPX_CUDA_CHECK(cudaGetDevice(&dev));
  PPX_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > static_cast<size_t>(optin))
    throw Error("CudaMimi: a conv needs " + std::to_string(smem) + " B of shared memory, the device allows " +
                std::to_string(optin));
  PPX_CUDA_CHECK(km::conv_gemv_reserve_smem(smem));
  PPX_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaMimi::~CudaMimi() = default;

void set_mimi_blas_rows(int rows) { g_blas_rows.store(rows <= 0 ? 0 : std::max(2, rows)); }
int mimi_blas_rows() { return g_blas_rows.load(); }

int CudaMimi::frame_samples() const { return p_->c.frame_samples(); }
int CudaMimi::num_codebooks() const { return p_->c.num_codebooks; }
int CudaMimi::slots() const { return p_->slots; }
size_t CudaMimi::weight_bytes() const {
  return p_->weight_floats * sizeof(float) + p_->weight_halves * sizeof(__half);
}
bool CudaMimi::fp16() const { return p_->fp16; }
void CudaMimi::set_mma_always(bool on) { p_->mma_always = on; }
int CudaMimi::blas_rows() const { return p_->blas_rows; }

namespace {
void check_slot(int slot, int slots) {
  if (slot < 0 || slot >= slots)
    throw Error("CudaMimi: slot " + std::to_string(slot) + " outside [0, " + std::to_string(slots) + ")");
}
}  // namespace

void CudaMimi::reset_encoder(int slot, cudaStream_t s) {
  check_slot(slot, p_->slots);
  PPX_CUDA_CHECK(cudaMemsetAsync(p_->ints.get() + static_cast<size_t>(slot) * p_->ints_stride, 0, sizeof(int), s));
}

void CudaMimi::reset_decoder(int slot, cudaStream_t s) {
  check_slot(slot, p_->slots);
  // Decoder frame counter and the last conv's done counter.
  PPX_CUDA_CHECK(cudaMemsetAsync(p_->ints.get() + static_cast<size_t>(slot) * p_->ints_stride + 1, 0, 2 * sizeof(int), s));
}

// One conv launch with `p` (cv.p, its caller's buffers patched in): on tensor cores where it has
// fp16 weights and the launch fills the device (or set_mma_always), as a cuBLAS GEMM where it has
// fp32 GEMM weights (set_mimi_blas_rows) and enough rows, else the fp32 kernel of its shape.
void CudaMimi::Impl::run_conv(const Direction& d, const Conv& cv, const km::ConvParams& p, const km::Batch& bt,
                              cudaStream_t s) const {
  if (cv.wg && bt.count >= blas_rows) {
    km::conv_im2col(p, d.blas_x.get(), bt, s);
    d.blas.gemm_tf32(km::conv_mma_rows(p), bt.count * km::conv_gemm_cols(p), km::conv_gemm_k(p), cv.wg,
                     d.blas_x.get(), d.blas_y.get(), s);
    km::conv_gemm_epilogue(p, d.blas_y.get(), bt, s);
  } else if (cv.mma && (mma_always || km::conv_mma_fills_device(p, bt.count))) {
    km::conv_mma(p, bt, s);
  } else if (cv.gemv) {
    km::conv_gemv(p, bt, s);
  } else {
    km::conv_direct(p, bt, s);
  }
}

void CudaMimi::Impl::run_convs(const Direction& d, const km::Batch& bt, const float* user_in, float* user_out,
                               cudaStream_t s) const {
  for (const Conv& cv : d.convs) {
    km::ConvParams p = cv.p;
    if (cv.x.off == -2) {
      p.x = km::Act{const_cast<float*>(user_in), cv.x.t, 0, cv.x.t, 1};
    }
    if (cv.raw.off == -2) p.out_raw = km::Act{user_out, cv.raw.t, 0, cv.raw.t, 1};
    run_conv(d, cv, p, bt, s);
  }
}

// With the cuBLAS path off (set_mimi_blas_rows(0), a bench's comparison) or below its threshold, the
// transformer's linears run as conv_mma (--mimi-fp16) from this many batch rows (or always with
// set_mma_always); fewer rows run the fp32 GEMV. As a GEMM a linear has few column tiles (2 per
// row, 64 per tile) and a long reduction per block, so below ~100 rows it is the slower of the two
// (H200, docs/PERF.md v0.20: encode + decode at 32 rows 174 + 171 us a row with the linears on
// tensor cores against 96 + 92 without; at 128 rows 76 + 79 against 82 + 84).
constexpr int kLinearMmaRows = 128;

// One transformer linear: the fp32 GEMV; or (kMma) its LayerNorm alone into d.xn and then the
// product as a k = 1 conv over the tokens on tensor cores, with the same epilogue; or (kBlas) its
// LayerNorm (or a plain copy) into the contiguous d.blas_x [rows][tokens][din], one TF32 cuBLAS GEMM
// over every row's tokens into d.blas_y, and the epilogue from there into the slots.
void CudaMimi::Impl::run_linear(const Direction& d, const km::LinearParams& lp, const void* w16, LinearPath path,
                                const km::Batch& bt, cudaStream_t s) const {
  if (path == LinearPath::kGemv) {
    km::linear(lp, bt, s);
    return;
  }
  if (path == LinearPath::kBlas) {
    const km::Act xs{d.blas_x.get(), static_cast<long long>(lp.tokens) * lp.din, 0, 1, lp.din};
    km::layer_norm(lp, xs, bt, s);
    d.blas.gemm_tf32(lp.dout, bt.count * lp.tokens, lp.din, lp.w, d.blas_x.get(), d.blas_y.get(), s);
    km::linear_epilogue(lp, d.blas_y.get(), bt, s);
    return;
  }
  km::ConvParams p;
  p.x = lp.x;
  if (lp.ln_w) {
    p.x = act_of(d.xn, d.acts.get(), d.act_layout.floats);
    km::layer_norm(lp, p.x, bt, s);
  }
  p.w16 = w16;
  p.cin = lp.din;
  p.cout = lp.dout;
  p.kernel = 1;
  p.stride = 1;
  p.t_in = lp.tokens;
  p.frame = d.frame;
  if (lp.epilogue == km::kLinearGelu) {
    p.out_gelu = lp.y;
  } else {
    p.out_raw = lp.y;
    if (lp.epilogue == km::kLinearScaledResidual) {
      p.ls = lp.ls;
      p.residual = lp.y;
    }
  }
  km::conv_mma(p, bt, s);
}

void CudaMimi::Impl::run_transformer(const Direction& d, const km::Batch& bt, cudaStream_t s) const {
  const MimiTransformerConfig& tc = c.transformer;
  const int D = tc.d_model, F = tc.dim_feedforward;
  const size_t per = d.act_layout.floats;
  float* acts = d.acts.get();
  const km::Act x = act_of(d.x, acts, per), qkv = act_of(d.qkv, acts, per), att = act_of(d.att, acts, per),
                ff = act_of(d.ff, acts, per);
  km::AttentionParams ap;
  ap.qkv = qkv.p;
  ap.qkv_stride = static_cast<long long>(per);
  ap.out = att.p;
  ap.out_stride = static_cast<long long>(per);
  ap.cache_stride = static_cast<long long>(d.state_layout.floats);
  ap.omega = omega.get();
  ap.dim = D;
  ap.heads = tc.num_heads;
  ap.capacity = tc.context;
  ap.context = tc.context;
  ap.tokens = tokens;
  ap.scale = 1.f / std::sqrt(static_cast<float>(D / tc.num_heads));
  ap.frame = d.frame;
  LinearPath path = LinearPath::kGemv;
  if (blas_rows > 0 && bt.count >= blas_rows) {
    path = LinearPath::kBlas;
  } else if (fp16 && (mma_always || bt.count >= kLinearMmaRows)) {
    path = LinearPath::kMma;
  }
  for (const TrLayer& l : d.layers) {
    km::LinearParams lp;
    lp.tokens = tokens;
    lp.w = l.in_proj, lp.din = D, lp.dout = 3 * D, lp.ln_w = l.norm1_w, lp.ln_b = l.norm1_b;
    lp.epilogue = km::kLinearStore, lp.x = x, lp.y = qkv;
    run_linear(d, lp, l.w16[0], path, bt, s);
    ap.k_cache = d.state.get() + l.k_off;
    ap.v_cache = d.state.get() + l.v_off;
    km::attention(ap, bt, s);
    lp = km::LinearParams{};
    lp.tokens = tokens;
    lp.w = l.out_proj, lp.din = D, lp.dout = D, lp.epilogue = km::kLinearScaledResidual, lp.ls = l.ls1;
    lp.x = att, lp.y = x;
    run_linear(d, lp, l.w16[1], path, bt, s);
    lp.w = l.linear1, lp.din = D, lp.dout = F, lp.ln_w = l.norm2_w, lp.ln_b = l.norm2_b;
    lp.epilogue = km::kLinearGelu, lp.ls = nullptr, lp.x = x, lp.y = ff;
    run_linear(d, lp, l.w16[2], path, bt, s);
    lp.w = l.linear2, lp.din = F, lp.dout = D, lp.ln_w = nullptr, lp.ln_b = nullptr;
    lp.epilogue = km::kLinearScaledResidual, lp.ls = l.ls2, lp.x = ff, lp.y = x;
    run_linear(d, lp, l.w16[3], path, bt, s);
  }
}

void CudaMimi::Impl::encode(const km::Batch& bt, const float* d_pcm, int32_t* d_codes, cudaStream_t s) const {
  const km::PdlScope scope(pdl);
  run_convs(enc, bt, d_pcm, nullptr, s);
  run_transformer(enc, bt, s);
  run_conv(enc, down, down.p, bt, s);
  const QuantizerConfig& q = c.quantizer;
  const int ncb = c.num_codebooks;
  km::RvqEncodeParams rp;
  rp.proj = proj, rp.books = books, rp.norms = norms;
  rp.in_dim = q.input_dimension, rp.dim = q.dimension, rp.bins = q.bins, rp.ncb = ncb;
  rp.z = act_of(z, enc.acts.get(), enc.act_layout.floats);
  rp.resid = enc.acts.get() + resid.off;
  rp.resid_stride = static_cast<long long>(enc.act_layout.floats);
  rp.state = ints.get() + 4, rp.state_stride = ints_stride;
  rp.cells = cells.get(), rp.cells_stride = ncb;
  rp.codes_out = d_codes;
  rp.advance = enc.frame;
  km::rvq_project(rp, bt, s);
  km::rvq_search(rp, 0, std::min(2, ncb), ncb <= 2, bt, s);
  for (int k = 2; k < ncb; ++k) km::rvq_search(rp, k, 1, k == ncb - 1, bt, s);
  PPX_CUDA_CHECK(cudaGetLastError());
}

void CudaMimi::Impl::decode(const km::Batch& bt, const int32_t* d_codes, float* d_pcm, cudaStream_t s) const {
  const km::PdlScope scope(pdl);
  const QuantizerConfig& q = c.quantizer;
  km::RvqDecodeParams rp;
  rp.codes = d_codes;
  rp.books = books, rp.dim = q.dimension, rp.bins = q.bins, rp.ncb = c.num_codebooks;
  rp.out_dim = q.output_dimension, rp.out_first = out_first, rp.out_rest = out_rest;
  rp.up_w = up_w, rp.stride = tokens;
  rp.zprev = dec.state.get() + zprev_off;
  rp.zprev_stride = static_cast<long long>(dec.state_layout.floats);
  rp.frame = dec.frame;
  rp.y = act_of(dec.x, dec.acts.get(), dec.act_layout.floats);
  km::rvq_decode_upsample(rp, bt, s);
  run_transformer(dec, bt, s);
  run_convs(dec, bt, nullptr, d_pcm, s);
  PPX_CUDA_CHECK(cudaGetLastError());
}

void CudaMimi::encode(int slot, const float* d_pcm, int32_t* d_codes, cudaStream_t s) {
  check_slot(slot, p_->slots);
  p_->encode(km::Batch{p_->slot_ids.get() + slot, 1}, d_pcm, d_codes, s);
}

void CudaMimi::decode(int slot, const int32_t* d_codes, float* d_pcm, cudaStream_t s) {
  check_slot(slot, p_->slots);
  p_->decode(km::Batch{p_->slot_ids.get() + slot, 1}, d_codes, d_pcm, s);
}

namespace {
void check_batch(const int* d_slots, int n, int slots) {
  if (d_slots == nullptr || n < 1 || n > slots)
    throw Error("CudaMimi: a batch of " + std::to_string(n) + " slots (1 .. " + std::to_string(slots) + " allowed)");
}
}  // namespace

void CudaMimi::encode_batch(const int* d_slots, int n, const float* d_pcm, int32_t* d_codes, cudaStream_t s) {
  check_batch(d_slots, n, p_->slots);
  p_->encode(km::Batch{d_slots, n}, d_pcm, d_codes, s);
}

void CudaMimi::decode_batch(const int* d_slots, int n, const int32_t* d_codes, float* d_pcm, cudaStream_t s) {
  check_batch(d_slots, n, p_->slots);
  p_->decode(km::Batch{d_slots, n}, d_codes, d_pcm, s);
}

}  // namespace ppx::cuda
