// One full-duplex conversation on the CPU reference path: the system prompts, then one 80 ms
// frame in -> one frame out (Mimi encode, LM step, Mimi decode), exactly as the upstream server
// and offline tool sequence them. Weights (Mimi, Lm) are shared; all state here is per session.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ppx/config.h"
#include "ppx/lm_gen.h"
#include "ppx/mimi.h"

namespace ppx {

// A precomputed voice prompt (.pt file contents): embeddings [n, dim] and the token cache [K, CT].
struct VoiceEmbeddings {
  int64_t n = 0, dim = 0;
  std::vector<float> embeddings;
  std::vector<int64_t> cache;
};

// Reads a PersonaPlex voice file (`embeddings` [n,1,1,dim], `cache` [1,K,CT]). Throws ppx::Error,
// also for a file over kMaxVoiceFileBytes (ppx/audio.h), before reading it.
VoiceEmbeddings load_voice_embeddings(const std::string& path);

struct SystemPrompt {
  std::optional<VoiceEmbeddings> voice;  // a .pt voice, or
  std::vector<float> voice_audio;        // voice audio at the model rate (already normalised), or neither
  std::vector<int> text_tokens;          // tokenized "<system> ... <system>", may be empty
  // voice_prompt_digest() (engine/prompt_cache.h) of the voice above when already known (a voice
  // from the server's VoiceCache), so that the prompt cache key need not hash the voice again;
  // empty: computed when needed. Set it only together with the voice it was computed from.
  std::string voice_digest;
};

// Reads the voice prompt at `path` into p: a ".pt" voice file into p.voice (load_voice_embeddings),
// any other file as audio into p.voice_audio (prepare_voice_audio at sample_rate, padded to whole
// frames of frame_samples). Throws ppx::Error as those do.
void load_voice_prompt(SystemPrompt& p, const std::string& path, int sample_rate, int frame_samples);

// Steps the system prompts would take (voice frames + silences + text tokens).
int64_t system_prompt_steps(const SystemPrompt& p, int frame_samples, int silence_frames);

struct FrameOut {
  std::vector<float> pcm;  // [frame_samples] agent audio (not clamped)
  int64_t text_token = 0;  // 0 = EPAD, 3 = PAD, else a SentencePiece id
  std::vector<int64_t> tokens;  // the whole frame [dep_q + 1]
};

// One session's codec stream: Mimi encode/decode with its streaming state, on some backend.
class CodecStream {
 public:
  virtual ~CodecStream() = default;
  virtual int frame_samples() const = 0;
  virtual int num_codebooks() const = 0;
  // Codes are in [0, codebook_size()); decode() refuses others.
  virtual int codebook_size() const = 0;
  virtual void reset() = 0;
  // pcm [frame_samples] -> codes [num_codebooks]
  virtual void encode(const float* pcm, int32_t* codes) = 0;
  // codes [num_codebooks] -> pcm [frame_samples]
  virtual void decode(const int32_t* codes, float* pcm) = 0;
  // encode() and decode() without waiting, where the stream can: `done` runs once the call is
  // complete (on another thread, or here before returning) with its error or nullptr. The arrays
  // must stay alive until then. A stream has at most one encode and one decode in flight at a time
  // (the two may overlap: the encoder's and the decoder's states are separate). By default the
  // call runs here.
  using Done = std::function<void(std::exception_ptr)>;
  virtual void encode_async(const float* pcm, int32_t* codes, Done done);
  virtual void decode_async(const int32_t* codes, float* pcm, Done done);
};

// A codec stream whose async calls run the blocking ones as a task handed to `post` (for example
// a session's strand), so that a stream with no async calls of its own (a per-session CUDA or
// CPU stream) never runs its work on the thread that completed the previous stage (a
// scheduler's). The blocking calls run here, as the inner stream's.
class PostingCodecStream : public CodecStream {
 public:
  using Post = std::function<void(std::function<void()>)>;
  PostingCodecStream(std::unique_ptr<CodecStream> inner, Post post)
      : inner_(std::move(inner)), post_(std::move(post)) {}
  int frame_samples() const override { return inner_->frame_samples(); }
  int num_codebooks() const override { return inner_->num_codebooks(); }
  int codebook_size() const override { return inner_->codebook_size(); }
  void reset() override { inner_->reset(); }
  void encode(const float* pcm, int32_t* codes) override { inner_->encode(pcm, codes); }
  void decode(const int32_t* codes, float* pcm) override { inner_->decode(codes, pcm); }
  void encode_async(const float* pcm, int32_t* codes, Done done) override {
    post_([this, pcm, codes, done = std::move(done)] { inner_->encode_async(pcm, codes, done); });
  }
  void decode_async(const int32_t* codes, float* pcm, Done done) override {
    post_([this, codes, pcm, done = std::move(done)] { inner_->decode_async(codes, pcm, done); });
  }

 private:
  std::unique_ptr<CodecStream> inner_;
  Post post_;
};

// The CPU reference codec stream.
class CpuCodecStream : public CodecStream {
 public:
  explicit CpuCodecStream(const Mimi& mimi) : mimi_(mimi) {}
  int frame_samples() const override { return mimi_.frame_samples(); }
  int num_codebooks() const override { return mimi_.num_codebooks(); }
  int codebook_size() const override { return mimi_.config().quantizer.bins; }
  void reset() override { st_.reset(); }
  void encode(const float* pcm, int32_t* codes) override { mimi_.encode(st_, pcm, codes); }
  void decode(const int32_t* codes, float* pcm) override { mimi_.decode(st_, codes, pcm); }

 private:
  const Mimi& mimi_;
  MimiState st_;
};

class Conversation {
 public:
  // `codec` and `stepper` must outlive this object; they hold the session's model state.
  Conversation(CodecStream& codec, LmStepper& stepper, const LmGenConfig& gen);
  ~Conversation();
  Conversation(const Conversation&) = delete;
  Conversation& operator=(const Conversation&) = delete;

  // Runs the four prompt phases (voice, silence, text, silence) and resets the codec. Throws
  // ppx::Error when they would not fit in the LM context. `on_step(done, total)` reports progress
  // and may return false to abandon (client gone).
  bool run_system_prompts(const SystemPrompt& p, const std::function<bool(int64_t, int64_t)>& on_step = {});
  // The refusals of run_system_prompts (too long for the context, a voice of another width, a
  // token outside the vocabulary), without running anything. Throws ppx::Error.
  void check_system_prompts(const SystemPrompt& p) const;
  // Instead of run_system_prompts: the state it left in an earlier conversation (lm_gen().state()
  // then), while the caller loads the matching LM state into the stepper (the prompt cache,
  // src/engine/prompt_cache.h). Resets the codec as the prompts end by doing.
  void restore_prompts(const LmGen::State& s);
  int frame_samples() const { return codec_.frame_samples(); }
  const LmGenConfig& gen_config() const { return cfg_; }
  // Wall time of each stage of the last step, in milliseconds.
  struct StageTimes {
    double encode = 0, lm = 0, decode = 0;
  };
  // One frame of user audio [frame_samples] -> the agent frame (always produced after prompts).
  std::optional<FrameOut> step(const float* pcm_in, StageTimes* times = nullptr);
  // step() without waiting for the codec and the LM where they can (CodecStream::encode_async,
  // LmStepper::run_async): returns at once, and `done` runs once the frame is complete with the
  // frame (nullopt before outputs start) or the error, on the thread that completed the frame's
  // last stage (a scheduler's: keep it short and hand longer work on), or here before returning.
  //
  // Up to kMaxFramesInFlight frames may be in flight, pipelined: a frame's encode runs while the
  // one before it is in the LM, and its LM step starts as soon as that one's step ends (its decode
  // runs beside). So a session that has fallen behind takes a frame in every batch step of the
  // schedulers instead of one every encode + step + decode, and the tokens are the same as one
  // frame at a time (each stage runs the frames in order, and the LM state passes from a step to
  // the next as in step()). The `done`s run in the order the frames were given, one at a time (a
  // frame given from within a `done` may complete while that `done` still runs). Once a frame
  // fails, the frames in flight behind it fail with the same error (their model state followed the
  // failed one's). Frames given after a failed encode or decode run as usual; after a failed LM
  // step the LM cannot step again (LmGen keeps the failed step pending), so they fail too: end the
  // session. This object, its codec and stepper must stay alive until every `done` has run (it may
  // be destroyed from within the last one). Throws ppx::Error when kMaxFramesInFlight frames are
  // already in flight.
  using FrameDone = std::function<void(std::optional<FrameOut>, std::exception_ptr)>;
  static constexpr int kMaxFramesInFlight = 2;
  void step_async(const float* pcm_in, FrameDone done);
  // Frames given to step_async() whose `done` has not run yet.
  int frames_in_flight() const;
  const LmGen& lm_gen() const { return gen_; }

 private:
  struct Frame;
  void pump();
  void encoded(Frame* f, std::exception_ptr e);
  void stepped(Frame* f, std::exception_ptr e);
  void decoded(Frame* f, std::exception_ptr e);
  void fail_locked(Frame* f, std::exception_ptr e);
  void claim_locked(std::vector<std::unique_ptr<Frame>>& ready);
  void deliver(std::vector<std::unique_ptr<Frame>> ready);

  CodecStream& codec_;
  LmStepper& stepper_;
  const LmConfig& lm_cfg_;
  LmGenConfig cfg_;
  LmGen gen_;
  // The frames of step_async() in flight, oldest first, and which stage runs one now (each at most
  // one frame at a time, in order). Guarded by mu_.
  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Frame>> frames_;
  bool encoding_ = false, stepping_ = false, decoding_ = false;
  bool delivering_ = false;  // a thread is running `done`s (they run one at a time, in order)
};

}  // namespace ppx
