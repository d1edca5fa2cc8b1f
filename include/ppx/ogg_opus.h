// Ogg Opus (RFC 7845) for the WebSocket audio stream (docs: /work/shared/docs/protocol.md §3).
//
// Server -> client: OggOpusWriter turns 80 ms PCM frames into one Ogg page each, holding one Opus
// packet, numbered from 2 after the OpusHead (seq 0) and OpusTags (seq 1) pages, because the
// browser's decoder only decodes pages with sequence number > 1.
//
// Client -> server: OggOpusReader takes the client's byte stream in arbitrary chunks (the browser
// sends one page per message: 20 ms packets, two per page; other clients may send anything),
// finds and CRC-checks pages with libogg, reassembles packets across pages, skips
// OpusHead/OpusTags, decodes at the model rate (mono) and queues the PCM. Bad input is skipped and
// counted, never fatal to the process; memory and the work wasted on bad input stay bounded
// whatever arrives.
//
// Neither class is thread-safe: each belongs to one session and is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct OpusEncoder;  // libopus opaque types (opus.h typedefs them to the same structs)
struct OpusDecoder;

namespace ppx {

// ---- Ogg container ----

// Ogg pages are read and written with libogg (RFC 3533 framing, CRC); these are the parts of the
// format our policy code needs.

// Ogg page header_type flags.
inline constexpr uint8_t kOggContinued = 0x01;  // first packet continues one from the last page
inline constexpr uint8_t kOggBos = 0x02;        // beginning of stream
inline constexpr uint8_t kOggEos = 0x04;        // end of stream

// Size of the largest possible Ogg page: 27-byte header, 255 lacing values, 255 * 255 body bytes.
inline constexpr size_t kOggMaxPageBytes = 27 + 255 + 255 * 255;

// ---- Opus header packets (RFC 7845 §5) ----

struct OpusHead {
  int version = 1;                 // major version must be 0 (values 0..15) for a readable stream
  int channels = 1;                // output channel count
  int pre_skip = 0;                // samples at 48 kHz to discard at the start of decoding
  uint32_t input_sample_rate = 0;  // informational: the encoder's input rate in Hz (0 = unknown)
  int output_gain_q8 = 0;          // dB in Q7.8, to apply when decoding
  int mapping_family = 0;          // 0: mono/stereo, one Opus stream per packet
  int stream_count = 1;            // from the mapping table (family != 0); 1 for family 0

  // The 19-byte packet for mapping family 0. Throws ppx::Error for a family other than 0.
  std::vector<uint8_t> serialize() const;
  // Parses an OpusHead packet; nullopt when it is not one, is truncated, or its major version is
  // not 0 (RFC 7845 says such streams must not be decoded).
  static std::optional<OpusHead> parse(const uint8_t* data, size_t n);
};

// An OpusTags packet with `vendor` and no user comments.
std::vector<uint8_t> make_opus_tags(const std::string& vendor);

// ---- libopus wrappers (RAII, move-only) ----

namespace opus {

// The largest packet an Encoder produces: the browser's decoder copies each packet into a
// 4000-byte buffer (protocol.md §3), so nothing we send may be larger.
inline constexpr int kMaxPacketBytes = 4000;

enum class Application {
  kVoip,   // OPUS_APPLICATION_VOIP: tuned for speech intelligibility (what upstream's sphn uses)
  kAudio,  // OPUS_APPLICATION_AUDIO: tuned for fidelity to the input (what the browser uses)
};

// Sample rates libopus encodes and decodes at.
bool is_opus_sample_rate(int hz);

class Encoder {
 public:
  // Throws ppx::Error for a rate libopus does not take (8/12/16/24/48 kHz), channels outside
  // 1..2, or a failed init. `bitrate_bps` 0 means libopus's automatic bitrate, which is
  // 60 * rate / frame_samples + rate * channels (24750 bps for 80 ms mono frames at 24 kHz).
  Encoder(int sample_rate, int channels, Application app, int bitrate_bps = 0);
  ~Encoder();
  Encoder(Encoder&&) noexcept;
  Encoder& operator=(Encoder&&) noexcept;

  // Encodes `frame_samples` samples per channel (interleaved when stereo) into one packet of at
  // most kMaxPacketBytes. The duration must be one libopus accepts: 2.5, 5, 10, 20, 40, 60, 80,
  // 100 or 120 ms. Samples are used as given (the writer clamps). Throws ppx::Error on failure.
  std::vector<uint8_t> encode(const float* pcm, int frame_samples);
  // Codec delay in samples per channel at sample_rate() (156 at 24 kHz: 6.5 ms).
  int lookahead() const;
  int sample_rate() const { return sample_rate_; }
  int channels() const { return channels_; }

 private:
  struct Free {
    void operator()(OpusEncoder* e) const;
  };
  std::unique_ptr<OpusEncoder, Free> enc_;
  int sample_rate_ = 0;
  int channels_ = 0;
};

class Decoder {
 public:
  // Throws ppx::Error for a rate libopus does not take, channels outside 1..2, or a failed init.
  // A mono decoder down-mixes stereo packets.
  Decoder(int sample_rate, int channels);
  ~Decoder();
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;

  // Decodes one packet into `out` (room for max_frame_samples() * channels() floats). Returns the
  // samples per channel written, or a negative libopus error code for an invalid packet (the
  // decoder stays usable). An empty packet is invalid here (no concealment is done).
  int decode(const uint8_t* packet, size_t n, float* out);
  // 120 ms at sample_rate(): the longest packet Opus allows.
  int max_frame_samples() const { return sample_rate_ * 120 / 1000; }
  void set_gain_q8(int gain_q8);  // OpusHead output gain, dB in Q7.8; clamped to libopus's range
  void reset();                   // back to the freshly created state
  int sample_rate() const { return sample_rate_; }
  int channels() const { return channels_; }

 private:
  struct Free {
    void operator()(OpusDecoder* d) const;
  };
  std::unique_ptr<OpusDecoder, Free> dec_;
  int sample_rate_ = 0;
  int channels_ = 0;
};

}  // namespace opus

// ---- Writer: PCM frames -> Ogg Opus pages ----
//
// Page layout: seq 0 OpusHead (BOS, granule 0), seq 1 OpusTags (granule 0), then one page per
// encode_frame() call, seq 2, 3, ..., each with exactly one packet and the granule position of
// RFC 7845: the total 48 kHz samples of all packets so far, pre-skip included (+3840 per 80 ms
// packet). The browser decoder ignores granules; strict readers (ffmpeg, opusdec) get exact
// timing. Encoder: OPUS_APPLICATION_VOIP, as upstream (sphn): the stream is speech meant for a
// listener, and VOIP mode spends its bits on intelligibility rather than waveform fidelity.
class OggOpusWriter {
 public:
  // sample_rate: 8000/12000/16000/24000/48000; channels 1 or 2; bitrate_bps 0 = libopus auto.
  // The serial number is random (std::random_device). Throws ppx::Error on bad arguments.
  explicit OggOpusWriter(int sample_rate = 24000, int channels = 1, int bitrate_bps = 0);

  // The two header pages, each a complete Ogg page: send them before any audio page, each as its
  // own message, or joined (headers() is head_page() followed by tags_page()).
  const std::vector<uint8_t>& head_page() const { return head_page_; }
  const std::vector<uint8_t>& tags_page() const { return tags_page_; }
  std::vector<uint8_t> headers() const;

  // Encodes one frame of `n` samples per channel (interleaved when stereo) into one Ogg page
  // holding one Opus packet. n is normally frame_samples() (80 ms); any duration libopus accepts
  // works (2.5 ... 120 ms). Samples are clamped to [-1, 1]; NaN and infinities become 0.
  // Throws ppx::Error for another n or after finish().
  std::vector<uint8_t> encode_frame(const float* pcm, int n);

  // Ends the stream: encodes 10 ms of silence (enough to flush the encoder's 6.5 ms lookahead)
  // into a last page flagged EOS whose granule is pre_skip() + all input samples at 48 kHz, so a
  // decoder that trims per RFC 7845 returns exactly the input. A decoder that does not trim (the
  // browser's) plays 10 ms more, of silence. Returns an empty vector when called again.
  std::vector<uint8_t> finish();

  int sample_rate() const { return sample_rate_; }
  int channels() const { return channels_; }
  int frame_samples() const { return sample_rate_ * 80 / 1000; }  // per channel, 80 ms
  int pre_skip() const { return pre_skip_; }                      // 48 kHz samples (312 at 24 kHz)
  uint32_t serial() const { return serial_; }
  int64_t granule() const { return granule_; }  // of the last page written (48 kHz samples)
  uint32_t next_sequence() const { return next_seq_; }
  bool finished() const { return finished_; }

 private:
  struct Stream;  // libogg's ogg_stream_state
  struct StreamFree {
    void operator()(Stream* s) const;
  };
  std::vector<uint8_t> page_for(const float* pcm, int n, bool eos, bool end_trim);
  // One packet -> one page (ogg_stream_packetin + ogg_stream_flush); advances next_seq_.
  std::vector<uint8_t> page_of(std::vector<uint8_t>& packet, int64_t granule, bool eos);

  int sample_rate_;
  int channels_;
  opus::Encoder enc_;
  std::unique_ptr<Stream, StreamFree> os_;
  uint32_t serial_ = 0;
  int pre_skip_ = 0;
  uint32_t next_seq_ = 0;
  int64_t packetno_ = 0;
  int64_t granule_ = 0;           // 48 kHz samples of all packets written
  int64_t input_samples_48_ = 0;  // 48 kHz samples of real (non-flush) input
  bool finished_ = false;
  std::vector<uint8_t> head_page_, tags_page_;
  std::vector<float> scratch_;
};

// ---- Reader: client Ogg Opus bytes -> PCM ----
//
// Pre-skip and end trimming are NOT applied: every decoded sample is returned, in order, and
// granule positions are ignored. This is what upstream does (sphn's reader), and it is what a live
// speech server wants:
//  - The browser (opus-recorder) writes a fixed pre-skip of 3840 (80 ms) although its encoder's
//    real delay is 6.5 ms, so honouring it would throw away ~74 ms of the user's speech onset.
//  - The model is driven by input frames; dropping samples lowers no latency, it only shifts the
//    frame grid. Keeping every sample keeps our frame boundaries identical to upstream's, and
//    the codec delay it leaves in (6.5 ms) is far below one 80 ms frame.
//  - End trimming needs the EOS granule, i.e. holding back the last page until the next arrives.
// So a stream of F frames from our own OggOpusWriter reads back as F * frame + 10 ms (finish()'s
// flush) samples, with the input delayed by the encoder lookahead. pre_skip() exposes the value
// for callers that want to trim.
//
// Robustness contract:
//  - Headers are optional; without OpusHead the stream is taken as Opus at any channel count,
//    decoded to mono. OpusHead/OpusTags packets are skipped wherever they appear.
//  - A page with a bad CRC, an unknown version or a foreign serial number, garbage between pages,
//    a sequence gap, a broken continuation, an oversized packet and an undecodable Opus packet
//    are each skipped and counted in errors(); parsing resyncs at the next "OggS".
//  - The first page fixes the serial number; a later BOS page with a new serial, or any page of a
//    new serial after our EOS, starts a new (chained) stream: decoder reset, headers optional
//    again. Other pages of a foreign serial are skipped.
//  - Memory: undecoded input held is at most about two Ogg pages (~128 KiB); a partial packet at
//    most kMaxPacketBytes; decoded PCM at most max_buffered_samples.
//  - Work: a valid page costs one CRC pass over its bytes. The work wasted on bad input is
//    budgeted for the whole stream (never reset by a valid page; allowances grow with the valid
//    input, so a long real stream with a few glitches stays far inside them), which keeps all
//    CRC work below 1 MiB + twice the input and all other work linear in the input:
//     * garbage: bytes skipped outside valid pages <= kGarbageAllowance + valid page bytes /
//       kGarbageValidShare. Skipping is cheap, but a stream that is not Ogg is not worth keeping.
//     * bad pages: bytes CRC-checked in candidate pages that failed (bad CRC, or version != 0)
//       <= kBadPageAllowance + valid page bytes / kBadPageValidShare. A fake header costs up to
//       64 KiB of CRC to advance a few bytes; this bounds that amplification for good.
//     * packets without audio: invalid Opus, empty and header packets <= kSilentPacketAllowance +
//       audio packets / kSilentPacketAudioShare. Every other packet yields at least 2.5 ms of
//       audio (the shortest Opus frame) at a decode cost proportional to its duration, so decoder
//       work stays proportional to the audio produced.
//  - failed() becomes true, for good, when the stream is unusable: decoded PCM exceeds
//    max_buffered_samples (the consumer is not keeping up), a work budget above is exceeded, or
//    OpusHead announces a multistream layout. After that push() ignores input and the input
//    buffer is released; PCM already decoded can still be read. error() says why, starting with
//    the cause ("garbage: ...", "bad pages: ...", "packets without audio: ...").
class OggOpusReader {
 public:
  static constexpr size_t kMaxPacketBytes = 65536;  // above any valid Opus packet (48 x 1275 B)
  static constexpr size_t kDefaultMaxBufferedSamples = 30 * 24000;  // 30 s at 24 kHz
  // Work budgets (see above). The fixed garbage allowance is what used to be allowed between two
  // valid pages; 1 MiB of wasted CRC is well under 1 ms of one core. A real client's glitch (a
  // lost, cut or corrupted page) wastes about one page (~0.1-4 KiB) of each, and an invalid Opus
  // packet is a client bug, so the fixed parts alone cover many glitches.
  static constexpr uint64_t kGarbageAllowance = uint64_t{1} << 20;
  static constexpr uint64_t kGarbageValidShare = 4;  // + 1 byte per 4 valid bytes
  static constexpr uint64_t kBadPageAllowance = uint64_t{1} << 20;
  static constexpr uint64_t kBadPageValidShare = 1;  // + 1 byte per valid byte
  static constexpr uint64_t kSilentPacketAllowance = 64;
  static constexpr uint64_t kSilentPacketAudioShare = 16;  // + 1 per 16 audio packets

  // sample_rate: output rate, one of libopus's (8/12/16/24/48 kHz); output is mono.
  // Throws ppx::Error on a bad rate or a zero cap.
  explicit OggOpusReader(int sample_rate = 24000,
                         size_t max_buffered_samples = kDefaultMaxBufferedSamples);
  ~OggOpusReader();

  // Feeds the next `n` bytes of the stream, split anywhere. Decodes every packet completed.
  void push(const uint8_t* data, size_t n);

  // Decoded samples waiting to be read.
  size_t available() const { return pcm_.size() - pcm_head_; }
  // Appends every waiting sample to `out`; returns how many.
  size_t read(std::vector<float>& out);
  // The next `n` samples, or an empty vector (nothing consumed) when fewer are waiting.
  std::vector<float> take(size_t n);

  size_t errors() const { return errors_; }
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }  // empty unless failed()
  // failed() because decoded PCM exceeded max_buffered_samples (audio faster than it is read).
  bool overflowed() const { return overflowed_; }

  uint64_t pages() const { return pages_; }      // valid pages accepted, all streams
  uint64_t packets() const { return packets_; }  // audio packets decoded
  // OpusHead of the current stream, when one was seen.
  const std::optional<OpusHead>& head() const { return head_; }
  // Pre-skip in samples at sample_rate(), from OpusHead; 0 when there was none. Not applied.
  int pre_skip() const;
  int sample_rate() const { return sample_rate_; }
  size_t buffered_bytes() const;  // undecoded input held

  // Work done so far on bad input, as charged to the budgets.
  uint64_t garbage_bytes() const { return garbage_bytes_; }
  uint64_t bad_page_bytes() const { return bad_page_bytes_; }
  uint64_t silent_packets() const { return silent_packets_; }
  uint64_t valid_bytes() const { return valid_bytes_; }  // bytes of valid pages

 private:
  struct Sync;  // libogg's ogg_sync_state
  struct SyncFree {
    void operator()(Sync* s) const;
  };
  void parse_pages();
  void on_page(const uint8_t* header, const uint8_t* body);  // a whole page, CRC checked
  void on_packet(const uint8_t* data, size_t n);
  void start_stream(uint32_t serial, uint32_t seq);
  void skip_garbage(size_t n);
  void charge_bad_page(size_t bytes);
  void charge_silent_packet();
  void fail(const std::string& why);

  int sample_rate_;
  size_t max_buffered_samples_;
  opus::Decoder dec_;
  bool dec_dirty_ = false;    // the decoder has state to reset for a new stream
  std::vector<float> frame_;  // decode scratch, max_frame_samples()

  std::unique_ptr<Sync, SyncFree> sync_;  // undecoded input, page search and CRC
  bool in_garbage_ = false;               // inside a run of skipped bytes (counted once)
  uint64_t valid_bytes_ = 0, garbage_bytes_ = 0, bad_page_bytes_ = 0;
  uint64_t silent_packets_ = 0;

  bool have_stream_ = false;
  uint32_t serial_ = 0;
  uint32_t next_seq_ = 0;
  uint64_t stream_packets_ = 0;   // packets seen in the current stream, headers included
  bool eos_seen_ = false;         // the current stream's EOS page has arrived
  std::vector<uint8_t> partial_;  // packet continuing onto the next page
  bool dropping_ = false;         // discarding the rest of a bad packet
  std::optional<OpusHead> head_;

  std::vector<float> pcm_;  // decoded; [pcm_head_, end) waiting
  size_t pcm_head_ = 0;

  size_t errors_ = 0;
  uint64_t pages_ = 0, packets_ = 0;
  bool failed_ = false, overflowed_ = false;
  std::string error_;
};

}  // namespace ppx
