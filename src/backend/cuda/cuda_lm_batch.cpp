#include "backend/cuda/cuda_lm_batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "lm_attention.cuh"
#include "lm_gemv.cuh"
#include "lm_misc.cuh"
#include "ppx/capacity.h"
#include "ppx/error.h"

namespace ppx::cuda {

namespace {

using bf16 = __nv_bfloat16;

}  // namespace

CudaLmBatch::CudaLmBatch(const CudaLm& lm, int slots, int dep_steps, int device)
    : lm_(lm), slots_(slots), rows_(std::max(slots, kPrefillRows)), device_(device) {
  const LmConfig& c = lm.config();
  if (slots < 1) throw Error("CudaLmBatch: at least one slot");
  dep_steps_ = dep_steps < 0 ? c.dep_q : std::min(dep_steps, c.dep_q);
  K_ = c.n_q + 1;
  S_ = c.dep_q;
  R_ = 2 * K_ + S_ + 3;
  const int D = c.dim, H = c.ffn_hidden(), DD = c.depformer_dim, DH = c.depformer_ffn_hidden();
  const size_t all = static_cast<size_t>(slots_) + 1;  // + the scratch slot
  PPX_CUDA_CHECK(cudaSetDevice(device_));
  PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PPX_CUDA_CHECK(cudaEventCreate(&ev0_));
  PPX_CUDA_CHECK(cudaEventCreate(&ev1_));
  {
    // The KV caches dominate: say how much they need before allocating (a failed cudaMalloc names no
    // flag). What capacity keeps back (2% and 1 GiB) stays for the row buffers, graphs and cuBLAS's
    // workspace (the codec is already made; the prompt cache's store, made after, checks itself).
    const double need =
        static_cast<double>(temporal_kv_bytes(c, all, lm.kv_fp8() ? KvDtype::kFp8 : KvDtype::kBf16));
    size_t free_b = 0, total_b = 0;
    PPX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (need > (1 - kMemoryHeadroom) * static_cast<double>(free_b) - kMemoryReserveBytes)
      throw Error("--max-sessions " + std::to_string(slots) + ": the KV caches of " + std::to_string(slots) +
                  " sessions (+1 scratch) need " + std::to_string(static_cast<int>(need / 1e9 + 0.5)) + " GB, " +
                  std::to_string(static_cast<int>(static_cast<double>(free_b) / 1e9)) +
                  " GB of device memory are free" + (lm.kv_fp8() ? "" : " (--kv-fp8 halves them)"));
  }
  kv_.allocate(c, all, lm.kv_fp8(), stream_);
  const size_t dkv = static_cast<size_t>(c.depformer_num_layers) * all * S_ * DD;
  dk_cache_.resize(dkv);
  dv_cache_.resize(dkv);
  pos_.resize(all);
  counter_.resize(all);
  seed_.resize(all);
  temp_text_.resize(all);
  temp_audio_.resize(all);
  top_k_text_.resize(all);
  top_k_audio_.resize(all);
  for (auto* b : {&pos_, &top_k_text_, &top_k_audio_}) b->zero(stream_);
  counter_.zero(stream_);
  seed_.zero(stream_);
  temp_text_.zero(stream_);
  temp_audio_.zero(stream_);

  const size_t r = static_cast<size_t>(rows_);
  in_.resize(r * R_);
  provided_.resize(r * K_);
  ext_.resize(r * D);
  x_.resize(r * D);
  qkv_.resize(r * 3 * D);
  q_.resize(r * D);
  att_.resize(r * D);
  gu_.resize(r * 2 * H);
  z_.resize(r * DD);
  dqkv_.resize(r * 3 * DD);
  datt_.resize(r * DD);
  dgu_.resize(r * 2 * DH);
  dpre_.resize(r * S_ * DD);
  xstage_.resize(kern::gemm_xstage_elems(rows_, std::max({D, H, DD, DH})));
  ws_.resize(kern::gemm_ws_floats(rows_, std::max({3 * D, 2 * H, c.text_card, S_ * DD, 3 * DD, 2 * DH, c.card})));
  work_.resize(kern::attention_work_floats(rows_, c.num_heads, D / c.num_heads, c.context));
  text_logits_.resize(r * c.text_card);
  audio_logits_.resize(r * S_ * c.card);
  sampled_.resize(r * (1 + S_));
  next_.resize(r);
  h_in_ = PinnedBuffer<int32_t>(r * R_);
  h_prov_ = PinnedBuffer<uint8_t>(r * K_);
  h_ext_ = PinnedBuffer<float>(r * D);
  h_out_ = PinnedBuffer<int32_t>(r * (1 + S_));
  row_pos_.resize(r);
  h_row_pos_ = PinnedBuffer<int32_t>(r);
  host_pos_.assign(all, 0);
  host_counter_.assign(all, 0);
  in_.zero(stream_);
  provided_.zero(stream_);
  ext_.zero(stream_);
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));

  buckets_ = batch_buckets(slots_);
  for (int b : buckets_) graphs_.push_back(capture_graph(stream_, [&] { enqueue_step(b, stream_); }));
}

CudaLmBatch::~CudaLmBatch() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (cudaGraphExec_t g : graphs_)
    if (g) cudaGraphExecDestroy(g);
  if (ev0_) cudaEventDestroy(ev0_);
  if (ev1_) cudaEventDestroy(ev1_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaLmBatch::attach_thread() { PPX_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaLmBatch::check_slot(int slot) const {
  if (slot < 0 || slot >= slots_) throw Error("LM slot " + std::to_string(slot) + " out of range");
}

void CudaLmBatch::open(int slot, const LmGenConfig& gen, uint64_t seed) {
  check_slot(slot);
  const SamplingParams sp = SamplingParams::from(gen, seed);
  const int32_t zero32 = 0;
  const uint64_t zero64 = 0;
  PPX_CUDA_CHECK(cudaMemcpyAsync(temp_text_.get() + slot, &sp.temp_text, sizeof(float), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(temp_audio_.get() + slot, &sp.temp_audio, sizeof(float), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(top_k_text_.get() + slot, &sp.top_k_text, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(top_k_audio_.get() + slot, &sp.top_k_audio, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(seed_.get() + slot, &sp.seed, sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(counter_.get() + slot, &zero64, sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(pos_.get() + slot, &zero32, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  host_pos_[static_cast<size_t>(slot)] = 0;
  host_counter_[static_cast<size_t>(slot)] = 0;
}

void CudaLmBatch::reset(int slot) {
  check_slot(slot);
  const int32_t zero32 = 0;
  PPX_CUDA_CHECK(cudaMemcpyAsync(pos_.get() + slot, &zero32, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  host_pos_[static_cast<size_t>(slot)] = 0;
}

void CudaLmBatch::set_slot_position(int slot, int32_t pos, uint64_t counter) {
  // Pinned staging is not needed for two words, but the copy must finish before `pos` and
  // `counter` leave scope: the caller synchronizes.
  PPX_CUDA_CHECK(cudaMemcpyAsync(pos_.get() + slot, &pos, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(counter_.get() + slot, &counter, sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  host_pos_[static_cast<size_t>(slot)] = pos;
  host_counter_[static_cast<size_t>(slot)] = counter;
}

size_t CudaLmBatch::prefix_bytes(int positions) const {
  const LmConfig& c = lm_.config();
  const size_t per = lm_.kv_fp8() ? static_cast<size_t>(c.dim) + c.num_heads  // codes, one scale byte a head
                                  : sizeof(bf16) * static_cast<size_t>(c.dim);
  return static_cast<size_t>(positions) * c.num_layers * 2 * per;
}

void CudaLmBatch::reserve_prefix_store(size_t bytes) {
  PPX_CUDA_CHECK(cudaSetDevice(device_));
  size_t free_b = 0, total_b = 0;
  PPX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (static_cast<double>(bytes) > 0.9 * static_cast<double>(free_b))
    throw Error("--prompt-cache-mb " + std::to_string(bytes >> 20) + ": " +
                std::to_string(static_cast<double>(free_b) / 1e9).substr(0, 5) +
                " GB of device memory are free after the KV caches; give a smaller cache or fewer --max-sessions");
  store_.resize(bytes);
}

void CudaLmBatch::copy_prefix(int slot, int positions, size_t offset, bool to_store) {
  const LmConfig& c = lm_.config();
  const size_t all = static_cast<size_t>(slots_) + 1;
  const size_t P = static_cast<size_t>(positions), L = static_cast<size_t>(c.num_layers);
  uint8_t* dst = store_.get() + offset;
  // One tensor [layer][slot][context][w] (w elements of `el` bytes per position): rows 0..P-1 of
  // `slot` in every layer, packed layer after layer in the store.
  auto tensor = [&](void* base, size_t w, size_t el) {
    uint8_t* cache = static_cast<uint8_t*>(base) + static_cast<size_t>(slot) * c.context * w * el;
    const size_t pitch = all * c.context * w * el, width = P * w * el;
    // One copy per layer: the layer pitch passes cudaMemcpy2D's pitch limit (2^31) at full size.
    for (size_t l = 0; l < L; ++l, dst += width) {
      uint8_t* layer = cache + l * pitch;
      PPX_CUDA_CHECK(cudaMemcpyAsync(to_store ? dst : layer, to_store ? layer : dst, width, cudaMemcpyDeviceToDevice, stream_));
    }
  };
  // A tensor laid out by head [layer][slot][head][n][e] with `e` bytes per (head, position) and n
  // >= C positions a head: per layer, H rows of P x e bytes (pitch n x e). The fp8 cache's scale
  // bytes (e = 1, n = kern::fp8_scale_pitch(C)) and, laid out by head (kern::RingArgs::fp8_by_head),
  // its codes (e = hd, n = C).
  auto per_head = [&](void* base, size_t e, size_t n) {
    const size_t H = static_cast<size_t>(c.num_heads);
    const size_t width = P * e, pitch = n * e;
    for (size_t l = 0; l < L; ++l, dst += H * width) {
      uint8_t* layer = static_cast<uint8_t*>(base) + (l * all + static_cast<size_t>(slot)) * H * pitch;
      if (to_store)
        PPX_CUDA_CHECK(cudaMemcpy2DAsync(dst, width, layer, pitch, width, H, cudaMemcpyDeviceToDevice, stream_));
      else
        PPX_CUDA_CHECK(cudaMemcpy2DAsync(layer, pitch, dst, width, width, H, cudaMemcpyDeviceToDevice, stream_));
    }
  };
  const size_t D = static_cast<size_t>(c.dim);
  if (lm_.kv_fp8()) {
    if (lm_.kv_fp8_by_head()) {
      const size_t hd = static_cast<size_t>(c.dim / c.num_heads);
      per_head(kv_.k8.get(), hd, c.context);
      per_head(kv_.v8.get(), hd, c.context);
    } else {
      tensor(kv_.k8.get(), D, 1);
      tensor(kv_.v8.get(), D, 1);
    }
    per_head(kv_.k_scale.get(), 1, kern::fp8_scale_pitch(c.context));
    per_head(kv_.v_scale.get(), 1, kern::fp8_scale_pitch(c.context));
  } else {
    tensor(kv_.k.get(), D, sizeof(bf16));
    tensor(kv_.v.get(), D, sizeof(bf16));
  }
}

LmBatch::PrefixInfo CudaLmBatch::save_prefix(int slot, size_t offset) {
  check_slot(slot);
  const int64_t P = host_pos_[static_cast<size_t>(slot)];
  if (P <= 0 || P >= lm_.config().context)
    throw Error("save_prefix: slot " + std::to_string(slot) + " is at position " + std::to_string(P) +
                " (a prefix needs 1 to " + std::to_string(lm_.config().context - 1) + ")");
  if (offset + prefix_bytes(static_cast<int>(P)) > store_.size())
    throw Error("save_prefix: past the end of the prompt cache store");
  // Queued behind the slot's steps on the batch's stream, as every later load is.
  copy_prefix(slot, static_cast<int>(P), offset, true);
  return PrefixInfo{static_cast<int>(P), host_counter_[static_cast<size_t>(slot)]};
}

void CudaLmBatch::load_prefix(int slot, const PrefixInfo& info, size_t offset) {
  check_slot(slot);
  if (info.positions <= 0 || info.positions >= lm_.config().context ||
      offset + prefix_bytes(info.positions) > store_.size())
    throw Error("load_prefix: no prefix of " + std::to_string(info.positions) + " positions at that place");
  copy_prefix(slot, info.positions, offset, false);
  set_slot_position(slot, info.positions, info.counter);  // synchronizes
}

void CudaLmBatch::prefill(int slot, const StepRequest* reqs, int n) {
  check_slot(slot);
  if (n <= 0) return;
  const LmConfig& c = lm_.config();
  const int64_t p0 = host_pos_[static_cast<size_t>(slot)];
  if (n > rows_ || p0 + n > c.context) {
    // Past the ring (or more rows than the buffers hold): the steps themselves.
    LmBatch::prefill(slot, reqs, n);
    return;
  }
  const int D = c.dim;
  // The request block as run() lays it out for B = n rows; only tokens, use_ext and slot are read.
  int32_t* tok = h_in_.get();
  int32_t* use_ext = tok + static_cast<size_t>(n) * (K_ + 1 + S_ + K_);
  int32_t* slot_col = use_ext + n;
  bool any_ext = false;
  for (int b = 0; b < n; ++b) {
    const StepRequest& r = reqs[b];
    for (int k = 0; k < K_; ++k) {
      if (!r.provided[k]) throw Error("prefill: stream " + std::to_string(k) + " is not provided");
      tok[static_cast<size_t>(b) * K_ + k] = static_cast<int32_t>(r.input[k]);
    }
    use_ext[b] = r.embedding ? 1 : 0;
    if (r.embedding) {
      std::memcpy(h_ext_.get() + static_cast<size_t>(b) * D, r.embedding, D * sizeof(float));
      any_ext = true;
    }
    slot_col[b] = slot;
    h_row_pos_.get()[b] = static_cast<int32_t>(p0 + b);
  }
  PPX_CUDA_CHECK(cudaMemcpyAsync(in_.get(), h_in_.get(), static_cast<size_t>(n) * R_ * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(row_pos_.get(), h_row_pos_.get(), static_cast<size_t>(n) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  if (any_ext)
    PPX_CUDA_CHECK(cudaMemcpyAsync(ext_.get(), h_ext_.get(), static_cast<size_t>(n) * D * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_));
  TemporalIo t = temporal_io(n);
  t.row_pos = row_pos_.get();
  t.text_logits = nullptr;  // no text head: nothing reads this pass's logits
  enqueue_temporal(lm_, t, stream_);
  PPX_CUDA_CHECK(cudaGetLastError());
  set_slot_position(slot, static_cast<int32_t>(p0 + n), host_counter_[static_cast<size_t>(slot)] + n);
}

void CudaLmBatch::enqueue_sample(int B, int stream_index, const float* logits, int64_t stride, int n,
                                 cudaStream_t s) {
  int32_t* force = in_.get() + static_cast<size_t>(B) * K_;
  int32_t* target = force + static_cast<size_t>(B) * (1 + S_);
  int32_t* slot = target + static_cast<size_t>(B) * K_ + B;
  kern::SampleArgs a;
  a.logits = logits;
  a.logits_stride = stride;
  a.n = n;
  a.slot = slot;
  a.temp = stream_index == 0 ? temp_text_.get() : temp_audio_.get();
  a.top_k = stream_index == 0 ? top_k_text_.get() : top_k_audio_.get();
  a.seed = seed_.get();
  a.counter = counter_.get();
  a.stream_id = stream_index;
  a.force = force + static_cast<size_t>(stream_index) * B;
  a.target = target + static_cast<size_t>(stream_index) * B;
  a.provided = provided_.get() + static_cast<size_t>(stream_index) * B;
  a.sampled = sampled_.get() + static_cast<size_t>(stream_index) * B;
  a.next = next_.get();
  kern::sample_tokens(a, B, s);
}

kern::GemmScratch CudaLmBatch::gemm_scratch() {
  kern::GemmScratch g;
  g.xstage = xstage_.get();
  g.ws = ws_.get();
  g.ws_floats = ws_.size();
  g.xstage_elems = xstage_.size();
  g.chain = &chain_;
  return g;
}

TemporalIo CudaLmBatch::temporal_io(int B) {
  const LmConfig& c = lm_.config();
  const size_t all = static_cast<size_t>(slots_) + 1;
  int32_t* tok = in_.get();
  int32_t* use_ext = tok + static_cast<size_t>(B) * (K_ + 1 + S_ + K_);
  TemporalIo t;
  t.B = B;
  t.tok = tok;
  t.use_ext = use_ext;
  t.ext = ext_.get();
  t.pos = pos_.get();
  t.slot = use_ext + B;
  kv_.bind(t, c, all);
  t.x = x_.get();
  t.qkv = qkv_.get();
  t.q = q_.get();
  t.att = att_.get();
  t.gu = gu_.get();
  t.work = work_.get();
  t.gemm = gemm_scratch();
  t.text_logits = text_logits_.get();
  return t;
}

void CudaLmBatch::enqueue_step(int B, cudaStream_t s) {
  const LmConfig& c = lm_.config();
  const int V = c.text_card, DD = c.depformer_dim;
  const size_t all = static_cast<size_t>(slots_) + 1;
  const TemporalIo t = temporal_io(B);
  const int32_t* slot = t.slot;
  enqueue_temporal(lm_, t, s);
  enqueue_sample(B, 0, text_logits_.get(), V, V, s);
  DepformerIo io;
  io.B = B;
  io.x = x_.get();
  io.token = next_.get();
  io.k_ring = dk_cache_.get();
  io.v_ring = dv_cache_.get();
  io.ring_layer_stride = static_cast<int64_t>(all) * S_ * DD;
  io.slot = slot;
  io.z = z_.get();
  io.qkv = dqkv_.get();
  io.att = datt_.get();
  io.gu = dgu_.get();
  io.pre = dpre_.get();
  io.pre_stride = static_cast<int64_t>(S_) * DD;
  io.logits = audio_logits_.get();
  io.logits_stride = static_cast<int64_t>(S_) * c.card;
  io.gemm = gemm_scratch();
  if (dep_steps_ > 0) enqueue_depformer_inputs(lm_, io, 0, dep_steps_, s);
  for (int st = 0; st < dep_steps_; ++st) {
    enqueue_depformer_kernels(lm_, io, st, s);
    enqueue_sample(B, 1 + st, audio_logits_.get() + static_cast<size_t>(st) * c.card, io.logits_stride, c.card, s);
  }
  kern::advance(pos_.get(), counter_.get(), slot, B, s);
  PPX_CUDA_CHECK(cudaMemcpyAsync(h_out_.get(), sampled_.get(), static_cast<size_t>(B) * (1 + S_) * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, s));
  PPX_CUDA_CHECK(cudaGetLastError());
}

void CudaLmBatch::run(const BatchStep* steps, int n) {
  if (n <= 0) return;
  if (n > slots_) throw Error("CudaLmBatch: more steps than slots");
  const LmConfig& c = lm_.config();
  const int D = c.dim;
  size_t bi = 0;
  while (buckets_[bi] < n) ++bi;
  const int B = buckets_[bi];
  // The request block for bucket B (layout in the header); rows n .. B-1 pad into the scratch slot
  // with nothing to embed and every stream provided.
  int32_t* tok = h_in_.get();
  int32_t* force = tok + static_cast<size_t>(B) * K_;
  int32_t* target = force + static_cast<size_t>(B) * (1 + S_);
  int32_t* use_ext = target + static_cast<size_t>(B) * K_;
  int32_t* slot = use_ext + B;
  uint8_t* prov = h_prov_.get();
  bool any_ext = false;
  for (int b = 0; b < B; ++b) {
    const bool real = b < n;
    const StepRequest* r = real ? steps[b].req : nullptr;
    if (real) check_slot(steps[b].slot);
    slot[b] = real ? steps[b].slot : slots_;
    use_ext[b] = real && r->embedding ? 1 : 0;
    if (use_ext[b]) {
      std::memcpy(h_ext_.get() + static_cast<size_t>(b) * D, r->embedding, D * sizeof(float));
      any_ext = true;
    }
    for (int k = 0; k < K_; ++k) {
      tok[static_cast<size_t>(b) * K_ + k] = real ? static_cast<int32_t>(r->input[k]) : -1;
      target[static_cast<size_t>(k) * B + b] = real ? static_cast<int32_t>(r->target[k]) : 0;
      prov[static_cast<size_t>(k) * B + b] = real ? r->provided[k] : 1;
    }
    for (int i = 0; i < 1 + S_; ++i)
      force[static_cast<size_t>(i) * B + b] = real && r->force ? static_cast<int32_t>(r->force[i]) : -1;
  }
  PPX_CUDA_CHECK(cudaMemcpyAsync(in_.get(), h_in_.get(), static_cast<size_t>(B) * R_ * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaMemcpyAsync(provided_.get(), prov, static_cast<size_t>(B) * K_, cudaMemcpyHostToDevice, stream_));
  if (any_ext)
    PPX_CUDA_CHECK(cudaMemcpyAsync(ext_.get(), h_ext_.get(), static_cast<size_t>(B) * D * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_));
  PPX_CUDA_CHECK(cudaEventRecord(ev0_, stream_));
  PPX_CUDA_CHECK(cudaGraphLaunch(graphs_[bi], stream_));
  PPX_CUDA_CHECK(cudaEventRecord(ev1_, stream_));
  for (int b = 0; b < n; ++b) {
    StepLogits* lg = steps[b].logits;
    if (!lg) continue;
    lg->text.resize(c.text_card);
    lg->audio.assign(static_cast<size_t>(S_) * c.card, NAN);
    PPX_CUDA_CHECK(cudaMemcpyAsync(lg->text.data(), text_logits_.get() + static_cast<size_t>(b) * c.text_card,
                                   c.text_card * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    PPX_CUDA_CHECK(cudaMemcpyAsync(lg->audio.data(), audio_logits_.get() + static_cast<size_t>(b) * S_ * c.card,
                                   static_cast<size_t>(dep_steps_) * c.card * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_));
  }
  PPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  PPX_CUDA_CHECK(cudaEventElapsedTime(&last_ms_, ev0_, ev1_));
  for (int b = 0; b < n; ++b) {
    ++host_pos_[static_cast<size_t>(steps[b].slot)];
    ++host_counter_[static_cast<size_t>(steps[b].slot)];
  }
  const int32_t* out = h_out_.get();
  for (int b = 0; b < n; ++b) {
    StepResult& o = *steps[b].out;
    o.text = out[b];
    o.audio.assign(S_, -1);
    for (int st = 0; st < dep_steps_; ++st) o.audio[st] = out[static_cast<size_t>(1 + st) * B + b];
  }
}

}  // namespace ppx::cuda
