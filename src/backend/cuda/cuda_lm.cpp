#include "backend/cuda/cuda_lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "lm_attention.cuh"
#include "lm_gemv.cuh"
#include "lm_misc.cuh"
#include "ppx/capacity.h"
#include "lm_quant.cuh"
#include "lm/lm_weights.h"
#include "ppx/dtype.h"
#include "ppx/error.h"
#include "ppx/weights.h"

namespace ppx::cuda {
namespace {

using bf16 = __nv_bfloat16;

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t key_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The state dict's linear layers' weights ([N, K] matrices a GEMV reads): everything 2-D except
// the embedding tables.
bool is_linear(const std::string& key, const std::vector<int64_t>& shape) {
  return shape.size() == 2 && key.find("emb.") == std::string::npos;
}

size_t pad64(int64_t n) { return (static_cast<size_t>(n) + 63) / 64 * 64; }


// Depformer step st adds the embedding of the previous stream's token: the text table at step 0,
// then audio table st - 1.
struct StepEmbedding {
  const bf16* table;
  int rows;
};
StepEmbedding step_embedding(const CudaLm& lm, int st) {
  const LmConfig& c = lm.config();
  return st == 0 ? StepEmbedding{lm.depformer_text_emb, c.text_card + 1}
                 : StepEmbedding{lm.depformer_emb[st - 1], c.card + 1};
}

}  // namespace

// y[B, N] = W[N, K] x (+ the prologue and epilogue of `in` and `out`), contiguous rows.
void enqueue_gemv(kern::GemvIn in, kern::GemvOut out, const LinearWeight& w, const bf16* x, int N, int K, bf16* y,
                  const bf16* alpha, int B, cudaStream_t s, const kern::GemmScratch& gemm, bool defer) {
  kern::GemvArgs a;
  a.x = x;
  a.x_stride = in == kern::GemvIn::kSiluGate ? 2 * K : K;
  a.N = N;
  a.K = K;
  a.B = B;
  a.alpha = alpha;
  a.y = y;
  a.y_stride = out == kern::GemvOut::kGateUp ? N / 2 : N;
  a.gemm = gemm;
  a.defer = defer;
  w.set(a);
  kern::gemv(in, out, a, s);
}

LinearWeight LinearWeight::rows_from(int64_t first) const {
  LinearWeight r = *this;
  if (w) r.w = w + first * cols;
  if (w8) r.w8 = w8 + first * cols;
  if (wi8) r.wi8 = wi8 + first * cols;
  if (w_scale) r.w_scale = w_scale + first;
  if (wq) r.wq = wq + first * cols;
  return r;
}

void LinearWeight::set(kern::GemvArgs& a) const {
  if (a.K != cols) throw Error("LinearWeight: a GEMV with K " + std::to_string(a.K) + " on a weight of " +
                               std::to_string(cols) + " columns");
  const bool q = w8 || wi8;
  a.w = q ? nullptr : w;
  a.w8 = w8;
  a.wi8 = wi8;
  a.w_scale = q ? w_scale : nullptr;
  a.wq = wi8 ? wq : nullptr;
}

void enqueue_depformer_inputs(const CudaLm& lm, const DepformerIo& io, int first, int steps, cudaStream_t s) {
  const LmConfig& c = lm.config();
  const int64_t DD = c.depformer_dim;
  kern::GemvArgs a;
  a.x = io.x;
  a.x_stride = c.dim;
  a.N = static_cast<int>(steps * DD);
  a.K = c.dim;
  a.B = io.B;
  a.alpha = lm.out_norm;
  a.y = io.pre + first * DD;
  a.y_stride = io.pre_stride;
  a.gemm = io.gemm;
  lm.depformer_in_all.rows_from(first * DD).set(a);
  kern::gemv(kern::GemvIn::kRmsNorm, kern::GemvOut::kStore, a, s);
}

void enqueue_depformer_kernels(const CudaLm& lm, const DepformerIo& io, int st, cudaStream_t s) {
  const LmConfig& c = lm.config();
  const int DD = c.depformer_dim, DH = c.depformer_ffn_hidden(), S = c.dep_q, B = io.B;
  using kern::GemvIn;
  using kern::GemvOut;
  // defer: the next call reads y (a GEMM chain, kern::GemvArgs::defer).
  auto gemv = [&](GemvIn in, GemvOut out, const LinearWeight& w, const bf16* x, int N, int Kd, bf16* y,
                  const bf16* alpha = nullptr, bool defer = false) {
    enqueue_gemv(in, out, w, x, N, Kd, y, alpha, B, s, io.gemm, defer);
  };
  kern::RingArgs dring;
  dring.C = S;
  dring.H = c.depformer_num_heads;
  dring.hd = DD / c.depformer_num_heads;
  dring.slot = io.slot;
  for (int l = 0; l < c.depformer_num_layers; ++l) {
    const CudaLm::Depformer& L = lm.dep_layers[l];
    dring.k = io.k_ring + l * io.ring_layer_stride;
    dring.v = io.v_ring + l * io.ring_layer_stride;
    if (l == 0) {
      // z = this step's input projection (io.pre) + the token embedding, stored while normed for
      // the QKV projection.
      kern::GemvArgs a;
      a.x = io.pre + static_cast<int64_t>(st) * DD;
      a.x_stride = io.pre_stride;
      a.N = 3 * DD;
      a.K = DD;
      a.B = B;
      a.alpha = L.norm1;
      a.y = io.qkv;
      a.y_stride = 3 * DD;
      const StepEmbedding e = step_embedding(lm, st);
      a.table = e.table;
      a.table_rows = e.rows;
      a.token = io.token;
      a.x_out = io.z;
      a.gemm = io.gemm;
      L.in_proj.rows_from(static_cast<int64_t>(st) * 3 * DD).set(a);
      kern::gemv(GemvIn::kEmbRmsNorm, GemvOut::kStore, a, s);
    } else {
      gemv(GemvIn::kRmsNorm, GemvOut::kStore, L.in_proj.rows_from(static_cast<int64_t>(st) * 3 * DD), io.z, 3 * DD,
           DD, io.qkv, L.norm1);
    }
    kern::depformer_attention(io.qkv, dring, B, st, io.att, s);
    gemv(GemvIn::kPlain, GemvOut::kResidual, L.out_proj.rows_from(static_cast<int64_t>(st) * DD), io.att, DD, DD,
         io.z);
    // defer: FFN in's split-K epilogue (the gate-up) may run inside FFN out's staging (a GEMM chain,
    // kern::gemm_set_chain; on as shipped).
    gemv(GemvIn::kRmsNorm, GemvOut::kGateUp, L.lin_in[st], io.z, 2 * DH, DD, io.gu, L.norm2, true);
    gemv(GemvIn::kPlain, GemvOut::kResidual, L.lin_out[st], io.gu, DD, DH, io.z);
  }
  kern::GemvArgs h;
  h.x = io.z;
  h.x_stride = DD;
  h.N = c.card;
  h.K = DD;
  h.B = B;
  h.yf = io.logits + static_cast<int64_t>(st) * c.card;
  h.y_stride = io.logits_stride;
  h.gemm = io.gemm;  // B > 4: one GEMM (without it, one GEMV launch per 4 rows: v0.27's 16 at 64 rows)
  lm.linears[st].set(h);
  kern::gemv(GemvIn::kPlain, GemvOut::kLogits, h, s);
}

SamplingParams SamplingParams::from(const LmGenConfig& g, uint64_t seed) {
  SamplingParams p;
  p.temp_text = g.use_sampling ? static_cast<float>(g.temp_text) : 0.f;
  p.temp_audio = g.use_sampling ? static_cast<float>(g.temp) : 0.f;
  p.top_k_text = g.top_k_text;
  p.top_k_audio = g.top_k;
  p.seed = seed;
  return p;
}

void CudaLm::allocate() {
  kern::gemv_init();
  kern::attention_init();
  // Every tensor in one bf16 arena (each padded to 64 elements), in state dict order.
  size_t total = 0;
  for (const auto& [key, shape] : lm_state_dict_spec(c_)) {
    Tensor t;
    t.key = key;
    t.shape = shape;
    t.linear = is_linear(key, shape);
    t.off = total;
    total += pad64(numel(shape));
    tensors_.push_back(std::move(t));
  }
  arena_.resize(total);
  weight_bytes_ = total * sizeof(bf16);
  bind();
}

void CudaLm::bind() {
  layers.assign(c_.num_layers, Temporal{});
  dep_layers.assign(c_.depformer_num_layers, Depformer{});
  for (auto& l : dep_layers) {
    l.lin_in.resize(c_.dep_q);
    l.lin_out.resize(c_.dep_q);
  }
  emb.clear();
  depformer_in.clear();
  depformer_emb.clear();
  linears.clear();
  for (const Tensor& t : tensors_) {
    const std::string& key = t.key;
    const bf16* p = t.in_fp8 ? nullptr : arena_.get() + t.off;
    LinearWeight lw;
    lw.cols = t.shape.back();
    if (t.in_fp8) {
      if (opt_.w8_int8) {
        lw.wi8 = reinterpret_cast<const int8_t*>(arena8_.get() + t.off8);
        if (arena_q_.size()) lw.wq = arena_q_.get() + t.off8;
      } else {
        lw.w8 = arena8_.get() + t.off8;
      }
      lw.w_scale = scales_.get() + t.off_scale;
    } else {
      lw.w = p;
    }
    auto idx = [&](const std::string& prefix) { return std::stoi(key.substr(prefix.size())); };
    auto has = [&](const char* part) { return key.find(part) != std::string::npos; };
    if (key.rfind("emb.", 0) == 0) emb.push_back(p);
    else if (key == "text_emb.weight") text_emb = p;
    else if (key.rfind("transformer.layers.", 0) == 0) {
      Temporal& l = layers[idx("transformer.layers.")];
      if (has("in_proj_weight")) l.in_proj = lw;
      else if (has("out_proj")) l.out_proj = lw;
      else if (has("norm1")) l.norm1 = p;
      else if (has("norm2")) l.norm2 = p;
      else if (has("linear_in")) l.lin_in = lw;
      else l.lin_out = lw;
    } else if (key == "out_norm.alpha") out_norm = p;
    else if (key == "text_linear.weight") text_linear = lw;
    else if (key.rfind("depformer_in.", 0) == 0) depformer_in.push_back(lw);
    else if (key.rfind("depformer_emb.", 0) == 0) depformer_emb.push_back(p);
    else if (key == "depformer_text_emb.weight") depformer_text_emb = p;
    else if (key.rfind("depformer.layers.", 0) == 0) {
      Depformer& l = dep_layers[idx("depformer.layers.")];
      if (has("in_proj_weight")) l.in_proj = lw;
      else if (has("out_proj")) l.out_proj = lw;
      else if (has("norm1")) l.norm1 = p;
      else if (has("norm2")) l.norm2 = p;
      else {
        const size_t g = key.find("gating.") + 7;
        const int s = std::stoi(key.substr(g));
        if (has("linear_in")) l.lin_in[s] = lw;
        else l.lin_out[s] = lw;
      }
    } else if (key.rfind("linears.", 0) == 0) linears.push_back(lw);
  }
  // The state dict lists depformer_in.0 .. depformer_in.{dep_q - 1} in order and their sizes need
  // no padding (bf16: multiples of 64 elements; fp8: packed), so the steps' input projections form
  // one [dep_q * DD, D] matrix in the arena (one GEMV for all steps, enqueue_depformer_inputs).
  depformer_in_all = depformer_in.empty() ? LinearWeight{} : depformer_in[0];
  for (size_t s = 0; s < depformer_in.size(); ++s) {
    const LinearWeight want = depformer_in_all.rows_from(static_cast<int64_t>(s) * c_.depformer_dim);
    if (depformer_in[s].w != want.w || depformer_in[s].w8 != want.w8 || depformer_in[s].wi8 != want.wi8 ||
        depformer_in[s].w_scale != want.w_scale)
      throw Error("depformer input projections are not contiguous in the weight arena");
  }
}

// w8a16: each linear weight [N, K] is quantized (fp8 e4m3, or int8 with w8_int8; the arena's bytes
// are read as that type) from its bf16 copy into arena8_ (packed: N K bytes,
// a multiple of 16 since K % 16 == 0, so rows stay 16-byte aligned) and scales_ (N floats); then
// the bf16 arena is rebuilt with the other tensors only (embeddings, norms) and the old one freed.
void CudaLm::quantize_linears() {
  size_t total8 = 0, total_scale = 0;
  for (Tensor& t : tensors_) {
    if (!t.linear) continue;
    const int64_t N = t.shape[0], K = t.shape[1];
    if (K % 16 != 0)
      throw Error("w8a16: " + t.key + " has " + std::to_string(K) + " columns, the 8-bit GEMV needs a multiple of 16");
    t.off8 = total8;
    t.off_scale = total_scale;
    total8 += static_cast<size_t>(N) * K;
    total_scale += static_cast<size_t>(N);
  }
  arena8_.resize(total8);
  scales_.resize(total_scale);
  for (const Tensor& t : tensors_) {
    if (!t.linear) continue;
    const int N = static_cast<int>(t.shape[0]), K = static_cast<int>(t.shape[1]);
    if (opt_.w8_int8) {
      kern::quantize_int8_rows(arena_.get() + t.off, N, K, reinterpret_cast<int8_t*>(arena8_.get() + t.off8),
                               scales_.get() + t.off_scale, nullptr);
    } else {
      kern::quantize_fp8_rows(arena_.get() + t.off, N, K, arena8_.get() + t.off8, scales_.get() + t.off_scale, nullptr);
    }
    PPX_CUDA_CHECK(cudaGetLastError());
  }
  size_t rest = 0;
  for (const Tensor& t : tensors_)
    if (!t.linear) rest += pad64(numel(t.shape));
  DeviceBuffer<bf16> kept(rest);
  size_t off = 0;
  for (Tensor& t : tensors_) {
    if (t.linear) {
      t.in_fp8 = true;
      continue;
    }
    PPX_CUDA_CHECK(cudaMemcpy(kept.get() + off, arena_.get() + t.off, static_cast<size_t>(numel(t.shape)) * sizeof(bf16),
                              cudaMemcpyDeviceToDevice));
    t.off = off;
    off += pad64(numel(t.shape));
  }
  PPX_CUDA_CHECK(cudaDeviceSynchronize());
  arena_ = std::move(kept);
  weight_bytes_ = arena_.bytes() + arena8_.bytes() + scales_.bytes();
  if (opt_.w8_int8 && kern::gemm_policy() == 3) {
    arena_q_.resize(total8);
    kern::int8_to_bf16(reinterpret_cast<const int8_t*>(arena8_.get()), arena_q_.get(), static_cast<int64_t>(total8),
                       nullptr);
    PPX_CUDA_CHECK(cudaGetLastError());
    PPX_CUDA_CHECK(cudaDeviceSynchronize());
  }
  bind();
}

void CudaLm::finish_tables() {
  if (opt_.w8a16) quantize_linears();
  std::vector<const bf16*> t{text_emb};
  std::vector<int32_t> rows{c_.text_card + 1};
  for (const bf16* e : emb) {
    t.push_back(e);
    rows.push_back(c_.card + 1);
  }
  emb_tables.resize(t.size());
  emb_tables.upload(t.data(), t.size());
  emb_rows.resize(rows.size());
  emb_rows.upload(rows.data(), rows.size());
  PPX_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaLm::CudaLm(const LmConfig& c, WeightSource& w, const CudaLmOptions& opt) : c_(c), opt_(opt) {
  allocate();
  std::vector<uint16_t> host;
  for (const Tensor& t : tensors_) {
    const std::vector<float> v = load_lm_tensor(w, t.key, t.shape);
    host.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) host[i] = f32_to_bf16(v[i]);
    PPX_CUDA_CHECK(cudaMemcpy(arena_.get() + t.off, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  }
  finish_tables();
}

CudaLm::CudaLm(const LmConfig& c, uint64_t seed, const CudaLmOptions& opt) : c_(c), opt_(opt) {
  allocate();
  for (const Tensor& t : tensors_) {
    const int64_t n = numel(t.shape);
    float scale, offset = 0.f;
    if (ends_with(t.key, "alpha")) {
      scale = 0.05f;
      offset = 1.f;
    } else {
      scale = 1.f / std::sqrt(static_cast<float>(t.shape.back()));
    }
    kern::fill_random_bf16(arena_.get() + t.off, n, seed ^ key_hash(t.key), scale, offset, nullptr);
  }
  PPX_CUDA_CHECK(cudaGetLastError());
  finish_tables();
}

CudaLm::~CudaLm() = default;

CudaLmStepper::CudaLmStepper(const CudaLm& lm, const SamplingParams& sp, int dep_steps, bool defer_user_steps)
    : lm_(lm), sp_(sp) {
  const LmConfig& c = lm.config();
  dep_steps_ = dep_steps < 0 ? c.dep_q : std::min(dep_steps, c.dep_q);
  const int D = c.dim, H = c.ffn_hidden(), DD = c.depformer_dim, DH = c.depformer_ffn_hidden(), S = c.dep_q;
  const int K = c.n_q + 1;
  // Depformer steps of user streams (s >= n_q / 2) are deferred to the tail.
  tail_begin_ = dep_steps_;
  if (defer_user_steps && dep_steps_ > c.n_q / 2) tail_begin_ = c.n_q / 2;
  PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PPX_CUDA_CHECK(cudaEventCreate(&ev0_));
  PPX_CUDA_CHECK(cudaEventCreate(&ev1_));
  if (tail_begin_ < dep_steps_) {
    PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&tail_stream_, cudaStreamNonBlocking));
    PPX_CUDA_CHECK(cudaEventCreateWithFlags(&dep_done_, cudaEventDisableTiming));
    for (auto& p : tail_ev_)
      for (auto& e : p) PPX_CUDA_CHECK(cudaEventCreate(&e));
  }
  kv_.allocate(c, 1, lm.kv_fp8(), stream_);
  const size_t dkv = static_cast<size_t>(c.depformer_num_layers) * S * DD;
  dk_cache_.resize(dkv);
  dv_cache_.resize(dkv);
  x_.resize(D);
  qkv_.resize(3 * D);
  q_.resize(D);
  att_.resize(D);
  gu_.resize(2 * static_cast<size_t>(H));
  z_.resize(DD);
  dqkv_.resize(3 * DD);
  datt_.resize(DD);
  dgu_.resize(2 * static_cast<size_t>(DH));
  dpre_.resize(static_cast<size_t>(S) * DD);
  work_.resize(kern::attention_work_floats(1, c.num_heads, D / c.num_heads, c.context));
  logits_.resize(c.text_card + static_cast<size_t>(S) * c.card);
  ext_.resize(D);
  req_.resize(K + 1 + S + K + 1);
  pos_.resize(1);
  slot_.resize(1);
  sampled_.resize(1 + S);
  next_.resize(1);
  top_k_.resize(2);
  provided_.resize(K);
  temp_.resize(2);
  seed_.resize(1);
  counter_.resize(1);
  h_req_ = PinnedBuffer<int32_t>(req_.size());
  h_prov_ = PinnedBuffer<uint8_t>(K);
  h_out_ = PinnedBuffer<int32_t>(1 + S);
  h_ext_ = PinnedBuffer<float>(D);
  if (tail_stream_) {
    tx_.resize(D);
    treq_.resize(req_.size());
    tnext_.resize(1);
    tsampled_.resize(dep_steps_ - tail_begin_);
    tprov_.resize(K);
    tcounter_.resize(1);
    h_tail_out_ = PinnedBuffer<int32_t>(tsampled_.size());
  }
  const int32_t zero = 0;
  slot_.upload(&zero, 1, stream_);
  const float temps[2] = {sp.temp_text, sp.temp_audio};
  temp_.upload(temps, 2, stream_);
  const int32_t topk[2] = {sp.top_k_text, sp.top_k_audio};
  top_k_.upload(topk, 2, stream_);
  seed_.upload(&sp.seed, 1, stream_);
  counter_.zero(stream_);
  std::memset(h_ext_.get(), 0, D * sizeof(float));
  reset();

  // Capture the step once; every run replays it.
  capture_graphs();
}

namespace {

void destroy(cudaGraphExec_t& g) {
  if (g) cudaGraphExecDestroy(g);
  g = nullptr;
}

}  // namespace

void CudaLmStepper::capture_graphs() {
  destroy(graph_main_);
  destroy(graph_dep_);
  destroy(graph_tail_);
  if (!tail_stream_) {
    graph_main_ = capture_graph(stream_, [&] {
      enqueue_main(stream_);
      enqueue_dep(stream_);
    });
    return;
  }
  graph_main_ = capture_graph(stream_, [&] { enqueue_main(stream_); });
  graph_dep_ = capture_graph(stream_, [&] { enqueue_dep(stream_); });
  graph_tail_ = capture_graph(tail_stream_, [&] { enqueue_tail(tail_stream_); });
}

DepformerIo CudaLmStepper::depformer_io() const {
  const LmConfig& c = lm_.config();
  DepformerIo io;
  io.B = 1;
  io.x = x_.get();
  io.token = next_.get();
  io.k_ring = dk_cache_.get();
  io.v_ring = dv_cache_.get();
  io.ring_layer_stride = static_cast<int64_t>(c.dep_q) * c.depformer_dim;
  io.slot = slot_.get();
  io.z = z_.get();
  io.qkv = dqkv_.get();
  io.att = datt_.get();
  io.gu = dgu_.get();
  io.pre = dpre_.get();
  io.pre_stride = static_cast<int64_t>(c.dep_q) * c.depformer_dim;
  io.logits = logits_.get() + c.text_card;
  io.logits_stride = static_cast<int64_t>(c.dep_q) * c.card;
  return io;
}

CudaLmStepper::~CudaLmStepper() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (tail_stream_) cudaStreamSynchronize(tail_stream_);
  destroy(graph_main_);
  destroy(graph_dep_);
  destroy(graph_tail_);
  for (cudaEvent_t e : {ev0_, ev1_, dep_done_, tail_ev_[0][0], tail_ev_[0][1], tail_ev_[1][0], tail_ev_[1][1]})
    if (e) cudaEventDestroy(e);
  if (tail_stream_) cudaStreamDestroy(tail_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaLmStepper::sync_all() {
  if (tail_stream_) PPX_CUDA_CHECK(cudaStreamSynchronize(tail_stream_));
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaLmStepper::reset() {
  sync_all();
  pos_.zero(stream_);
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaLmStepper::enqueue_sample(const SampleIo& io, int stream_index, const float* logits, int n,
                                   cudaStream_t s) {
  const LmConfig& c = lm_.config();
  const int K = c.n_q + 1, S = c.dep_q;
  kern::SampleArgs a;
  a.logits = logits;
  a.logits_stride = n;
  a.n = n;
  a.temp = temp_.get() + (stream_index == 0 ? 0 : 1);
  a.top_k = top_k_.get() + (stream_index == 0 ? 0 : 1);
  a.seed = seed_.get();
  a.counter = io.counter;
  a.stream_id = stream_index;
  a.force = io.req + K + stream_index;           // req_: tokens [K] | force [1 + S] | target [K] | use_ext
  a.target = io.req + K + 1 + S + stream_index;
  a.provided = io.provided + stream_index;
  a.sampled = io.sampled + (stream_index - io.first_stream);
  a.next = io.next;
  kern::sample_tokens(a, 1, s);
}

static_assert(kv_fp8_scale_pitch(3000) == 3008 && kern::fp8_scale_pitch(3000) == 3008 && kv_fp8_scale_pitch(17) == 32 &&
                  kern::fp8_scale_pitch(17) == 32 && kv_fp8_scale_pitch(16) == 16 && kern::fp8_scale_pitch(16) == 16,
              "the capacity model's scale pitch is the attention's");

void TemporalKv::allocate(const LmConfig& c, size_t slots, bool fp8, cudaStream_t s) {
  const size_t values = static_cast<size_t>(c.num_layers) * slots * c.context * c.dim;
  if (fp8) {
    k8.resize(values);
    v8.resize(values);
    const size_t sc = static_cast<size_t>(c.num_layers) * slots * c.num_heads * kern::fp8_scale_pitch(c.context);
    k_scale.resize(sc);
    v_scale.resize(sc);
    // The padding past C is read (never used) by the attention's 16-byte copies; on the stream the
    // steps run on (a non-blocking one: the default stream would not order the two).
    k_scale.zero(s);
    v_scale.zero(s);
  } else {
    k.resize(values);
    v.resize(values);
  }
}

void TemporalKv::bind(TemporalIo& io, const LmConfig& c, size_t slots) const {
  io.k = k.get();
  io.v = v.get();
  io.k8 = k8.get();
  io.v8 = v8.get();
  io.k_scale = k_scale.get();
  io.v_scale = v_scale.get();
  io.layer_kv = slots * c.context * c.dim;
  io.layer_sc = slots * c.num_heads * kern::fp8_scale_pitch(c.context);
}

void enqueue_temporal(const CudaLm& lm, const TemporalIo& io, cudaStream_t s) {
  const LmConfig& c = lm.config();
  const int D = c.dim, H = c.ffn_hidden(), K = c.n_q + 1, V = c.text_card, B = io.B;
  kern::embed_sum(lm.emb_tables.get(), lm.emb_rows.get(), K, io.tok, io.use_ext, io.ext, D, B, io.x, s);
  kern::RingArgs ring;
  ring.C = c.context;
  ring.H = c.num_heads;
  ring.hd = D / c.num_heads;
  ring.context = c.context;
  ring.pos = io.pos;
  ring.slot = io.slot;
  ring.row_pos = io.row_pos;
  using kern::GemvIn;
  using kern::GemvOut;
  // defer: the next call reads y (a GEMM chain, kern::GemvArgs::defer).
  auto gemv = [&](GemvIn in, GemvOut out, const LinearWeight& w, const bf16* x, int N, int Kd, bf16* y,
                  const bf16* alpha = nullptr, bool defer = false) {
    enqueue_gemv(in, out, w, x, N, Kd, y, alpha, B, s, io.gemm, defer);
  };
  // A sequence starts with nothing pending (one left by an enqueue that threw is dropped: its
  // partial sums are not this sequence's).
  if (io.gemm.chain != nullptr) io.gemm.chain->pending = false;
  for (int l = 0; l < c.num_layers; ++l) {
    const CudaLm::Temporal& L = lm.layers[l];
    if (lm.kv_fp8()) {
      ring = ring.over_fp8(io.k8 + l * io.layer_kv, io.v8 + l * io.layer_kv, io.k_scale + l * io.layer_sc,
                           io.v_scale + l * io.layer_sc, lm.kv_fp8_by_head());
    } else {
      ring.k = io.k + l * io.layer_kv;
      ring.v = io.v + l * io.layer_kv;
    }
    gemv(GemvIn::kRmsNorm, GemvOut::kStore, L.in_proj, io.x, 3 * D, D, io.qkv, L.norm1);
    kern::rope_append(io.qkv, io.q, ring, B, static_cast<float>(c.max_period), s);
    kern::ring_attention(io.q, ring, B, io.work, io.att, s);
    gemv(GemvIn::kPlain, GemvOut::kResidual, L.out_proj, io.att, D, D, io.x);
    // defer: FFN in's split-K epilogue (the gate-up) may run inside FFN out's staging (a GEMM chain,
    // kern::gemm_set_chain; on as shipped).
    gemv(GemvIn::kRmsNorm, GemvOut::kGateUp, L.lin_in, io.x, 2 * H, D, io.gu, L.norm2, true);
    gemv(GemvIn::kPlain, GemvOut::kResidual, L.lin_out, io.gu, D, H, io.x);
  }
  // Text head on out_norm(x).
  if (io.text_logits == nullptr) return;
  kern::GemvArgs a;
  a.x = io.x;
  a.x_stride = D;
  a.N = V;
  a.K = D;
  a.B = B;
  a.alpha = lm.out_norm;
  a.yf = io.text_logits;
  a.y_stride = V;
  a.gemm = io.gemm;
  lm.text_linear.set(a);
  kern::gemv(GemvIn::kRmsNorm, GemvOut::kLogits, a, s);
}

void CudaLmStepper::enqueue_main(cudaStream_t s) {
  const LmConfig& c = lm_.config();
  const int S = c.dep_q;
  const int K = c.n_q + 1, V = c.text_card;
  int32_t* tok = req_.get();
  int32_t* use_ext = tok + K + 1 + S + K;
  PPX_CUDA_CHECK(cudaMemcpyAsync(req_.get(), h_req_.get(), req_.bytes(), cudaMemcpyHostToDevice, s));
  PPX_CUDA_CHECK(cudaMemcpyAsync(provided_.get(), h_prov_.get(), provided_.bytes(), cudaMemcpyHostToDevice, s));
  PPX_CUDA_CHECK(cudaMemcpyAsync(ext_.get(), h_ext_.get(), ext_.bytes(), cudaMemcpyHostToDevice, s));

  TemporalIo io;
  io.tok = tok;
  io.use_ext = use_ext;
  io.ext = ext_.get();
  io.pos = pos_.get();
  io.slot = slot_.get();
  kv_.bind(io, c, 1);
  io.x = x_.get();
  io.qkv = qkv_.get();
  io.q = q_.get();
  io.att = att_.get();
  io.gu = gu_.get();
  io.work = work_.get();
  io.text_logits = logits_.get();
  enqueue_temporal(lm_, io, s);
  enqueue_sample(live_sample_io(), 0, logits_.get(), V, s);
  PPX_CUDA_CHECK(cudaGetLastError());
}

void CudaLmStepper::enqueue_dep(cudaStream_t s) {
  const LmConfig& c = lm_.config();
  const int V = c.text_card;
  const SampleIo sio = live_sample_io();
  const DepformerIo io = depformer_io();
  if (tail_begin_ > 0) enqueue_depformer_inputs(lm_, io, 0, tail_begin_, s);
  for (int st = 0; st < tail_begin_; ++st) {
    enqueue_depformer_kernels(lm_, io, st, s);
    enqueue_sample(sio, 1 + st, logits_.get() + V + static_cast<size_t>(st) * c.card, c.card, s);
  }
  if (tail_stream_) {
    // The tail's inputs, before the next frame's main graph overwrites them.
    kern::CopySpans cp;
    cp.add(x_.get(), tx_.get(), x_.bytes());
    cp.add(req_.get(), treq_.get(), req_.bytes());
    cp.add(provided_.get(), tprov_.get(), provided_.bytes());
    cp.add(counter_.get(), tcounter_.get(), counter_.bytes());
    cp.add(next_.get(), tnext_.get(), next_.bytes());
    kern::copy_spans(cp, s);
  }
  kern::advance(pos_.get(), counter_.get(), slot_.get(), 1, s);
  PPX_CUDA_CHECK(cudaMemcpyAsync(h_out_.get(), sampled_.get(), sampled_.bytes(), cudaMemcpyDeviceToHost, s));
  PPX_CUDA_CHECK(cudaGetLastError());
}

void CudaLmStepper::enqueue_tail(cudaStream_t s) {
  const LmConfig& c = lm_.config();
  const int V = c.text_card;
  const SampleIo sio{treq_.get(), tprov_.get(), tcounter_.get(), tsampled_.get(), 1 + tail_begin_, tnext_.get()};
  DepformerIo io = depformer_io();
  io.x = tx_.get();
  io.token = tnext_.get();
  enqueue_depformer_inputs(lm_, io, tail_begin_, dep_steps_ - tail_begin_, s);
  for (int st = tail_begin_; st < dep_steps_; ++st) {
    enqueue_depformer_kernels(lm_, io, st, s);
    enqueue_sample(sio, 1 + st, logits_.get() + V + static_cast<size_t>(st) * c.card, c.card, s);
  }
  PPX_CUDA_CHECK(
      cudaMemcpyAsync(h_tail_out_.get(), tsampled_.get(), tsampled_.bytes(), cudaMemcpyDeviceToHost, s));
  PPX_CUDA_CHECK(cudaGetLastError());
}

void CudaLmStepper::run(const StepRequest& req, StepResult& out, StepLogits* logits) {
  const LmConfig& c = lm_.config();
  const int K = c.n_q + 1, S = c.dep_q;
  int32_t* h = h_req_.get();
  for (int k = 0; k < K; ++k) h[k] = static_cast<int32_t>(req.input[k]);
  for (int i = 0; i < 1 + S; ++i) h[K + i] = req.force ? static_cast<int32_t>(req.force[i]) : -1;
  for (int k = 0; k < K; ++k) h[K + 1 + S + k] = static_cast<int32_t>(req.target[k]);
  h[2 * K + 1 + S] = req.embedding ? 1 : 0;
  for (int k = 0; k < K; ++k) h_prov_[k] = req.provided[k];
  if (req.embedding) std::memcpy(h_ext_.get(), req.embedding, c.dim * sizeof(float));
  // The tail's results are needed when logits are asked for or a tail stream is not provided.
  bool wait_tail = logits != nullptr;
  for (int st = tail_begin_; st < dep_steps_; ++st) wait_tail = wait_tail || !req.provided[1 + st];

  PPX_CUDA_CHECK(cudaEventRecord(ev0_, stream_));
  PPX_CUDA_CHECK(cudaGraphLaunch(graph_main_, stream_));
  if (tail_stream_) {
    const int p = parity_, q = parity_ ^ 1;
    // The depformer's buffers are shared with the previous frame's tail. (Waiting on an event
    // never recorded is a no-op.)
    PPX_CUDA_CHECK(cudaStreamWaitEvent(stream_, tail_ev_[q][1], 0));
    PPX_CUDA_CHECK(cudaGraphLaunch(graph_dep_, stream_));
    PPX_CUDA_CHECK(cudaEventRecord(dep_done_, stream_));
    PPX_CUDA_CHECK(cudaStreamWaitEvent(tail_stream_, dep_done_, 0));
    PPX_CUDA_CHECK(cudaEventRecord(tail_ev_[p][0], tail_stream_));
    PPX_CUDA_CHECK(cudaGraphLaunch(graph_tail_, tail_stream_));
    PPX_CUDA_CHECK(cudaEventRecord(tail_ev_[p][1], tail_stream_));
  }
  PPX_CUDA_CHECK(cudaEventRecord(ev1_, stream_));
  if (tail_stream_ && wait_tail) PPX_CUDA_CHECK(cudaStreamWaitEvent(stream_, tail_ev_[parity_][1], 0));
  if (logits) {
    logits->text.resize(c.text_card);
    logits->audio.assign(static_cast<size_t>(S) * c.card, NAN);
    PPX_CUDA_CHECK(cudaMemcpyAsync(logits->text.data(), logits_.get(), c.text_card * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    PPX_CUDA_CHECK(cudaMemcpyAsync(logits->audio.data(), logits_.get() + c.text_card,
                                   static_cast<size_t>(dep_steps_) * c.card * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_));
  }
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  PPX_CUDA_CHECK(cudaEventElapsedTime(&last_ms_, ev0_, ev1_));
  if (tail_stream_) {
    // The previous frame's tail finished before this frame's depformer started.
    const int q = parity_ ^ 1;
    if (tail_ran_) PPX_CUDA_CHECK(cudaEventElapsedTime(&last_tail_ms_, tail_ev_[q][0], tail_ev_[q][1]));
    tail_ran_ = true;
    parity_ = q;
  }
  out.text = h_out_[0];
  out.audio.assign(S, -1);
  for (int st = 0; st < tail_begin_; ++st) out.audio[st] = h_out_[1 + st];
  if (wait_tail)
    for (int st = tail_begin_; st < dep_steps_; ++st) out.audio[st] = h_tail_out_[st - tail_begin_];
}

}  // namespace ppx::cuda
