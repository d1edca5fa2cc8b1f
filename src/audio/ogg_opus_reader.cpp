// OggOpusReader: client Ogg Opus byte stream -> mono PCM (contract in ppx/ogg_opus.h).
//
// Input is appended to buf_ in slices of at most kPushSlice bytes and parsed after each slice, so
// buf_ never holds more than one incomplete page plus one slice. Parsing looks for "OggS", waits
// until the whole page (header, lacing table, body) is there, checks its CRC, and on any failure
// moves on by one byte only: a fake capture pattern inside garbage must not swallow the real pages
// that follow it. Packets are cut from the lacing values (a value below 255 ends a packet) and
// may continue across pages; partial_ carries the head of such a packet.

#include <algorithm>
#include <cstring>

#include "ppx/error.h"
#include "ppx/ogg_opus.h"

namespace ppx {

namespace {

constexpr size_t kHeaderBytes = 27;
constexpr size_t kPushSlice = 64 * 1024;
constexpr uint8_t kCapture[4] = {'O', 'g', 'g', 'S'};

uint32_t get_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

bool starts_with(const uint8_t* p, size_t n, const char* tag) {
  return n >= 8 && std::memcmp(p, tag, 8) == 0;
}

}  // namespace

OggOpusReader::OggOpusReader(int sample_rate, size_t max_buffered_samples)
    : sample_rate_(sample_rate), max_buffered_samples_(max_buffered_samples), dec_(sample_rate, 1) {
  if (max_buffered_samples_ == 0) throw Error("Ogg Opus reader: PCM cap must be positive");
  frame_.resize(static_cast<size_t>(dec_.max_frame_samples()));
}

OggOpusReader::~OggOpusReader() = default;

int OggOpusReader::pre_skip() const { return head_ ? head_->pre_skip / (48000 / sample_rate_) : 0; }

void OggOpusReader::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  error_ = why;
  partial_.clear();  // buf_ is released by push(), which may be inside parse_pages() now
}

void OggOpusReader::push(const uint8_t* data, size_t n) {
  if (failed_ || data == nullptr) return;
  while (n > 0 && !failed_) {
    const size_t k = std::min(n, kPushSlice);
    buf_.insert(buf_.end(), data, data + k);
    data += k;
    n -= k;
    parse_pages();
    // Drop what was parsed; what remains is at most one incomplete page (or 3 bytes of a
    // possible capture pattern), so this moves little.
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
    if (buffered_bytes() > 2 * kOggMaxPageBytes) {  // cannot happen; a hard stop if it does
      fail("Ogg Opus reader: internal buffer overflow");
    }
  }
  if (failed_) {
    buf_.clear();
    buf_.shrink_to_fit();
    pos_ = 0;
  }
}

void OggOpusReader::skip_garbage(size_t n) {
  if (!in_garbage_) ++errors_;  // one error per run of skipped bytes
  in_garbage_ = true;
  pos_ += n;
  unsynced_bytes_ += n;
  if (unsynced_bytes_ > kMaxUnsyncedBytes) {
    fail("Ogg Opus reader: no valid Ogg page in " + std::to_string(unsynced_bytes_) +
         " bytes of input");
  }
}

void OggOpusReader::parse_pages() {
  while (!failed_) {
    const uint8_t* p = buf_.data() + pos_;
    const size_t avail = buf_.size() - pos_;
    if (avail < 4) return;
    if (std::memcmp(p, kCapture, 4) != 0) {
      // Skip to the next capture pattern; keep a tail that could be its first bytes.
      const uint8_t* end = p + avail;
      const uint8_t* hit = std::search(p + 1, end, kCapture, kCapture + 4);
      skip_garbage(hit == end ? avail - 3 : static_cast<size_t>(hit - p));
      continue;
    }
    if (avail < kHeaderBytes) return;
    if (p[4] != 0) {  // stream structure version: only 0 exists
      skip_garbage(1);
      continue;
    }
    const size_t nseg = p[26];
    if (avail < kHeaderBytes + nseg) return;
    size_t body = 0;
    for (size_t i = 0; i < nseg; ++i) body += p[kHeaderBytes + i];
    const size_t size = kHeaderBytes + nseg + body;
    if (avail < size) return;
    uint32_t crc = ogg_crc32(p, 22);
    const uint8_t zeros[4] = {0, 0, 0, 0};
    crc = ogg_crc32(zeros, 4, crc);
    crc = ogg_crc32(p + 26, size - 26, crc);
    if (crc != get_u32(p + 22)) {
      ++errors_;  // one error for the bad page; the bytes skipped after it are part of it
      in_garbage_ = true;
      skip_garbage(1);
      continue;
    }
    in_garbage_ = false;
    unsynced_bytes_ = 0;
    on_page(p);
    pos_ += size;
  }
}

void OggOpusReader::start_stream(uint32_t serial, uint32_t seq) {
  if (have_stream_) dec_.reset();
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

void OggOpusReader::on_page(const uint8_t* page) {
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
  const uint8_t* body = lacing + nseg;
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
  if (starts_with(data, n, "OpusTags")) return;
  if (n == 0) return;  // no audio in it (RFC 6716 packets have at least a TOC byte)
  const int got = dec_.decode(data, n, frame_.data());
  if (got < 0) {
    ++errors_;
    return;
  }
  ++packets_;
  if (available() + static_cast<size_t>(got) > max_buffered_samples_) {
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
