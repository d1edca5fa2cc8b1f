// OggOpusReader: client Ogg Opus byte stream -> mono PCM (contract in ppx/ogg_opus.h).
//
// Pages: libogg's ogg_sync_state holds the input (ogg_sync_buffer/ogg_sync_wrote, in slices of at
// most kPushSlice bytes) and ogg_sync_pageseek finds pages and checks their CRC. On a failed
// candidate it moves on to the next 'O' only, so a fake capture pattern inside garbage cannot
// swallow the real pages that follow it. It CRC-checks every complete candidate before skipping
// it, which is where hostile input gets its leverage: before each call we look at the candidate
// (the public fields data/returned/fill) and, when pageseek then skips, charge the bytes its CRC
// covered to the bad-page budget.
//
// Packets: we cut them ourselves from the lacing values of each libogg-verified page (a value
// below 255 ends a packet; partial_ carries a packet continuing onto the next page), rather than
// using ogg_stream_state, because (1) libogg's stream buffer grows without limit for a packet
// continued over endless pages, and capping it would mean mirroring its lacing logic before each
// ogg_stream_pagein anyway, while here the partial packet is dropped at kMaxPacketBytes as it
// grows; (2) on a page that does not continue a packet the previous page left open, libogg
// appends the new segments to the stale partial packet, where we drop it and count an error;
// (3) errors() counts gaps, bad continuations and oversized packets exactly as before.

#include <ogg/ogg.h>

#include <algorithm>
#include <cstring>

#include "ppx/error.h"
#include "ppx/ogg_opus.h"

namespace ppx {

struct OggOpusReader::Sync {
  ogg_sync_state oy;
};

void OggOpusReader::SyncFree::operator()(Sync* s) const {
  ogg_sync_clear(&s->oy);
  delete s;
}

namespace {

constexpr size_t kHeaderBytes = 27;
constexpr size_t kPushSlice = 64 * 1024;

uint32_t get_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

bool starts_with(const uint8_t* p, size_t n, const char* tag) {
  return n >= 8 && std::memcmp(p, tag, 8) == 0;
}

// Size of the candidate page at p when all of it is there (what ogg_sync_pageseek will CRC),
// else 0.
size_t complete_candidate(const uint8_t* p, size_t avail) {
  if (avail < kHeaderBytes || std::memcmp(p, "OggS", 4) != 0) return 0;
  const size_t nseg = p[26];
  if (avail < kHeaderBytes + nseg) return 0;
  size_t size = kHeaderBytes + nseg;
  for (size_t i = 0; i < nseg; ++i) size += p[kHeaderBytes + i];
  return avail < size ? 0 : size;
}

}  // namespace

OggOpusReader::OggOpusReader(int sample_rate, size_t max_buffered_samples)
    : sample_rate_(sample_rate),
      max_buffered_samples_(max_buffered_samples),
      dec_(sample_rate, 1),
      sync_(new Sync{}) {
  if (max_buffered_samples_ == 0) throw Error("Ogg Opus reader: PCM cap must be positive");
  frame_.resize(static_cast<size_t>(dec_.max_frame_samples()));
  ogg_sync_init(&sync_->oy);
}

OggOpusReader::~OggOpusReader() = default;

size_t OggOpusReader::buffered_bytes() const {
  return static_cast<size_t>(sync_->oy.fill - sync_->oy.returned);
}

int OggOpusReader::pre_skip() const { return head_ ? head_->pre_skip / (48000 / sample_rate_) : 0; }

void OggOpusReader::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  error_ = why;
  partial_.clear();  // the sync buffer is released by push(), which may be inside parse_pages()
}

void OggOpusReader::push(const uint8_t* data, size_t n) {
  if (failed_ || data == nullptr) return;
  ogg_sync_state& oy = sync_->oy;
  while (n > 0 && !failed_) {
    const size_t k = std::min(n, kPushSlice);
    // Compacts what was parsed; what remains is at most one incomplete page, so the buffer stays
    // below two pages (plus libogg's 4 KiB of slack).
    char* dst = ogg_sync_buffer(&oy, static_cast<long>(k));
    if (dst == nullptr) {
      fail("Ogg Opus reader: no memory for the input buffer");
      break;
    }
    std::memcpy(dst, data, k);
    ogg_sync_wrote(&oy, static_cast<long>(k));
    data += k;
    n -= k;
    parse_pages();
    if (buffered_bytes() > kOggMaxPageBytes) {  // cannot happen; a hard stop if it does
      fail("Ogg Opus reader: internal buffer overflow");
    }
  }
  if (failed_) ogg_sync_clear(&oy);  // back to an empty, zeroed state: nothing held
}

void OggOpusReader::skip_garbage(size_t n) {
  if (!in_garbage_) ++errors_;  // one error per run of skipped bytes
  in_garbage_ = true;
  garbage_bytes_ += n;
  const uint64_t allowed = kGarbageAllowance + valid_bytes_ / kGarbageValidShare;
  if (garbage_bytes_ > allowed) {
    fail("garbage: " + std::to_string(garbage_bytes_) + " bytes of input were no valid Ogg page " +
         "(allowed: " + std::to_string(kGarbageAllowance) + " + 1/" +
         std::to_string(kGarbageValidShare) + " of " + std::to_string(valid_bytes_) +
         " valid bytes)");
  }
}

void OggOpusReader::charge_bad_page(size_t bytes) {
  ++errors_;  // one error for the bad page; the bytes skipped after it are part of it
  in_garbage_ = true;
  bad_page_bytes_ += bytes;
  const uint64_t allowed = kBadPageAllowance + valid_bytes_ / kBadPageValidShare;
  if (bad_page_bytes_ > allowed) {
    fail("bad pages: " + std::to_string(bad_page_bytes_) +
         " bytes CRC-checked in corrupt Ogg pages (allowed: " + std::to_string(kBadPageAllowance) +
         " + 1/" + std::to_string(kBadPageValidShare) + " of " + std::to_string(valid_bytes_) +
         " valid bytes)");
  }
}

void OggOpusReader::charge_silent_packet() {
  ++silent_packets_;
  const uint64_t allowed = kSilentPacketAllowance + packets_ / kSilentPacketAudioShare;
  if (silent_packets_ > allowed) {
    fail("packets without audio: " + std::to_string(silent_packets_) +
         " invalid, empty or header Opus packets (allowed: " +
         std::to_string(kSilentPacketAllowance) + " + 1/" +
         std::to_string(kSilentPacketAudioShare) + " of " + std::to_string(packets_) +
         " audio packets)");
  }
}

void OggOpusReader::parse_pages() {
  ogg_sync_state& oy = sync_->oy;
  while (!failed_) {
    // What pageseek is about to CRC-check, if it gets that far.
    const size_t candidate =
        complete_candidate(oy.data + oy.returned, static_cast<size_t>(oy.fill - oy.returned));
    ogg_page og;
    const long got = ogg_sync_pageseek(&oy, &og);
    if (got == 0) return;  // needs more input
    if (got < 0) {         // skipped: garbage, or a candidate whose CRC failed
      if (candidate > 0) charge_bad_page(candidate);
      if (!failed_) skip_garbage(static_cast<size_t>(-got));
      continue;
    }
    if (ogg_page_version(&og) != 0) {  // only version 0 exists: not a page of any stream
      charge_bad_page(static_cast<size_t>(got));
      if (!failed_) skip_garbage(static_cast<size_t>(got));
      continue;
    }
    in_garbage_ = false;
    valid_bytes_ += static_cast<uint64_t>(got);
    on_page(og.header, og.body);
  }
}

void OggOpusReader::start_stream(uint32_t serial, uint32_t seq) {
  if (dec_dirty_) dec_.reset();  // only after decoding: chaining empty streams costs no resets
  dec_dirty_ = false;
  have_stream_ = true;
  serial_ = serial;
  next_seq_ = seq;
  stream_packets_ = 0;
  eos_seen_ = false;
  partial_.clear();
  dropping_ = false;
  head_.reset();
  dec_.set_gain_q8(0);
}

void OggOpusReader::on_page(const uint8_t* page, const uint8_t* body) {
  const uint8_t flags = page[5];
  const uint32_t serial = get_u32(page + 14);
  const uint32_t seq = get_u32(page + 18);
  // A new stream starts at a BOS page with a new serial (RFC 3533 chaining), or at any page of a
  // new serial once ours has ended.
  if (!have_stream_ || (serial != serial_ && ((flags & kOggBos) || eos_seen_))) {
    start_stream(serial, seq);
  } else if (serial != serial_) {
    ++errors_;  // a page of some other stream: not ours to decode
    return;
  }
  ++pages_;
  const bool continued = flags & kOggContinued;
  if (seq != next_seq_) {
    ++errors_;  // pages lost or reordered: a packet spanning the gap cannot be trusted
    partial_.clear();
    dropping_ = continued;
  } else if (continued && partial_.empty() && !dropping_) {
    ++errors_;  // continues a packet we never saw the start of
    dropping_ = true;
  } else if (!continued && (!partial_.empty() || dropping_)) {
    ++errors_;  // the previous page promised a continuation that did not come
    partial_.clear();
    dropping_ = false;
  }
  next_seq_ = seq + 1;
  if (flags & kOggEos) eos_seen_ = true;

  const size_t nseg = page[26];
  const uint8_t* lacing = page + kHeaderBytes;
  size_t off = 0;
  for (size_t i = 0; i < nseg; ++i) {
    const size_t len = lacing[i];
    if (!dropping_) {
      if (partial_.size() + len > kMaxPacketBytes) {
        ++errors_;
        partial_.clear();
        dropping_ = true;
      } else {
        partial_.insert(partial_.end(), body + off, body + off + len);
      }
    }
    off += len;
    if (len < 255) {  // packet ends here
      if (!dropping_) on_packet(partial_.data(), partial_.size());
      partial_.clear();
      dropping_ = false;
      if (failed_) return;
    }
  }
}

void OggOpusReader::on_packet(const uint8_t* data, size_t n) {
  const uint64_t index = stream_packets_++;
  if (starts_with(data, n, "OpusHead")) {
    charge_silent_packet();
    if (failed_) return;
    if (index != 0) return;  // a stray copy: skipped, like upstream
    head_ = OpusHead::parse(data, n);
    if (!head_) {
      ++errors_;  // unreadable: carry on as if there were none
      return;
    }
    if (head_->stream_count != 1) {
      fail("Ogg Opus reader: multistream Opus (" + std::to_string(head_->stream_count) +
           " streams) is not supported");
      return;
    }
    dec_.set_gain_q8(head_->output_gain_q8);
    return;
  }
  if (starts_with(data, n, "OpusTags") || n == 0) {  // n == 0: not even a TOC byte, no audio
    charge_silent_packet();
    return;
  }
  const int got = dec_.decode(data, n, frame_.data());
  dec_dirty_ = true;
  if (got < 0) {
    ++errors_;
    charge_silent_packet();
    return;
  }
  ++packets_;
  if (available() + static_cast<size_t>(got) > max_buffered_samples_) {
    overflowed_ = true;
    fail("Ogg Opus reader: more than " + std::to_string(max_buffered_samples_) +
         " decoded samples waiting to be read");
    return;
  }
  if (pcm_head_ > 0 && pcm_head_ >= pcm_.size() / 2) {
    pcm_.erase(pcm_.begin(), pcm_.begin() + static_cast<std::ptrdiff_t>(pcm_head_));
    pcm_head_ = 0;
  }
  pcm_.insert(pcm_.end(), frame_.begin(), frame_.begin() + got);
}

size_t OggOpusReader::read(std::vector<float>& out) {
  const size_t n = available();
  out.insert(out.end(), pcm_.begin() + static_cast<std::ptrdiff_t>(pcm_head_), pcm_.end());
  pcm_.clear();
  pcm_head_ = 0;
  return n;
}

std::vector<float> OggOpusReader::take(size_t n) {
  if (n == 0 || available() < n) return {};
  const auto first = pcm_.begin() + static_cast<std::ptrdiff_t>(pcm_head_);
  std::vector<float> out(first, first + static_cast<std::ptrdiff_t>(n));
  pcm_head_ += n;
  if (pcm_head_ == pcm_.size()) {
    pcm_.clear();
    pcm_head_ = 0;
  }
  return out;
}

}  // namespace ppx
