#include "moe/train/tensorboard_writer.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "moe/ckpt/durable_file.h"
#include "moe/core/error.h"
#include "moe/core/host_name.h"

namespace moe {

namespace fs = std::filesystem;

namespace {

// Field numbers of tensorboard/compat/proto/event.proto and summary.proto.
constexpr int kEventWallTime = 1;     // double
constexpr int kEventStep = 2;         // int64
constexpr int kEventFileVersion = 3;  // string
constexpr int kEventSummary = 5;      // Summary
constexpr int kSummaryValue = 1;      // repeated Summary.Value
constexpr int kValueTag = 1;          // string
constexpr int kValueSimpleValue = 2;  // float
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;  // protobuf wire types

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void put_little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void put_length_delimited(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

uint64_t get_little_endian(std::string_view bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

// Reads a varint at `at`, advancing it; false when the bytes end first or it is too long.
bool get_varint(std::string_view bytes, size_t& at, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && at < bytes.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(bytes[at++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// The step of a serialized Event and whether it holds a summary; false when it does not parse.
bool parse_event(std::string_view event, int64_t& step, bool& summary) {
  step = 0;
  summary = false;
  size_t at = 0;
  while (at < event.size()) {
    uint64_t key = 0, v = 0;
    if (!get_varint(event, at, key)) return false;
    const int field = static_cast<int>(key >> 3), wire_type = static_cast<int>(key & 7);
    switch (wire_type) {
      case kVarint:
        if (!get_varint(event, at, v)) return false;
        if (field == kEventStep) step = static_cast<int64_t>(v);
        break;
      case kFixed64:
        at += 8;
        break;
      case kFixed32:
        at += 4;
        break;
      case kLengthDelimited:
        if (!get_varint(event, at, v) || v > event.size() - at) return false;
        at += v;
        if (field == kEventSummary) summary = true;
        break;
      default:
        return false;
    }
    if (at > event.size()) return false;
  }
  return true;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

float scalar_value(const nlohmann::json& v, bool& ok) {
  ok = true;
  if (v.is_number()) return static_cast<float>(v.get<double>());
  if (v.is_boolean()) return v.get<bool>() ? 1.0f : 0.0f;
  if (v.is_string()) {  // metrics.jsonl writes non-finite numbers as strings
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "nan") return std::numeric_limits<float>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<float>::infinity();
    if (s == "-inf") return -std::numeric_limits<float>::infinity();
  }
  ok = false;
  return 0;
}

// The event files of a TensorBoard directory, in name (= creation time) order; none when it is absent.
std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file(ec) && e.path().filename().string().find("tfevents") != std::string::npos)
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  // ISA-L's iSCSI CRC is CRC-32C without the final inversion; its length is an int.
  unsigned int crc = 0xffffffffu;
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - at, size_t{1} << 30);
    crc = crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(bytes.data() + at)), static_cast<int>(n), crc);
    at += n;
  }
  return ~crc;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string length;
  put_little_endian(length, data.size(), 8);
  std::string out = length;
  put_little_endian(out, masked_crc32c(length), 4);
  out += data;
  put_little_endian(out, masked_crc32c(data), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_length_delimited(event, kEventFileVersion, "brain.Event:2");
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_length_delimited(v, kValueTag, tag);
    put_float(v, kValueSimpleValue, value);
    put_length_delimited(summary, kSummaryValue, v);
  }
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_tag(event, kEventStep, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  put_length_delimited(event, kEventSummary, summary);
  return event;
}

Scalars record_scalars(const nlohmann::json& record) {
  Scalars scalars;
  bool ok = false;
  for (const auto& [key, v] : record.items()) {
    if (key == "step") continue;
    if (v.is_array()) {
      const std::string prefix = key == "expert_load_max_over_mean_per_layer" ? "expert_load/layer_" : key + "/";
      for (size_t i = 0; i < v.size(); ++i) {
        const float x = scalar_value(v[i], ok);
        if (ok) scalars.emplace_back(prefix + std::to_string(i), x);
      }
      continue;
    }
    if (v.is_object() && key == "eval_sets") {  // {"name": loss, ...}: one curve per validation set
      for (const auto& [name, loss] : v.items()) {
        const float x = scalar_value(loss, ok);
        if (ok) scalars.emplace_back("eval_loss/" + name, x);
      }
      continue;
    }
    const float x = scalar_value(v, ok);
    if (ok) scalars.emplace_back(key, x);
  }
  return scalars;
}

TensorBoardWriter::TensorBoardWriter(std::string dir) : dir_(std::move(dir)) {}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::open(double wall_time) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  MOE_CHECK(!ec, "cannot create the TensorBoard directory '", dir_, "' (run.tensorboard): ", ec.message());
  const std::string host = host_name();
  const std::string base = dir_ + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time)) + "." +
                           (host.empty() ? "localhost" : host) + "." + std::to_string(::getpid());
  std::string path = base;
  for (int n = 2;; ++n) {  // never reuse a name: an existing file is another start's
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ >= 0 || errno != EEXIST) break;
    path = base + "." + std::to_string(n);
  }
  MOE_CHECK(fd_ >= 0, "cannot create TensorBoard event file '", path, "': ", errno_text());
  path_ = path;
  try {
    append(tfrecord(file_version_event(wall_time)));
  } catch (...) {
    ::close(fd_);  // an empty file of ours: nothing to keep
    fd_ = -1;
    ::unlink(path_.c_str());
    path_.clear();
    throw;
  }
}

void TensorBoardWriter::append(const std::string& bytes) {
  append_whole(fd_, bytes, "TensorBoard event file", path_);  // readers stop at a record they cannot frame
}

void TensorBoardWriter::write(const nlohmann::json& record) {
  const double now = unix_seconds();
  if (fd_ < 0) open(now);
  append(tfrecord(scalars_event(now, record.at("step").get<int64_t>(), record_scalars(record))));
}

std::vector<EventRecord> read_event_records(const std::string& path, std::string_view bytes, size_t* tail_offset) {
  std::vector<EventRecord> events;
  size_t at = 0;
  while (bytes.size() - at >= 12) {
    const std::string_view length_bytes = bytes.substr(at, 8);
    MOE_CHECK(get_little_endian(bytes, at + 8, 4) == masked_crc32c(length_bytes), "TensorBoard event file '", path,
              "' is corrupt: the length of the record at byte ", at, " fails its CRC");
    const uint64_t length = get_little_endian(bytes, at, 8);
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4) break;  // cut off
    const std::string_view data = bytes.substr(at + 12, length);
    MOE_CHECK(get_little_endian(bytes, at + 12 + length, 4) == masked_crc32c(data), "TensorBoard event file '", path,
              "' is corrupt: the record at byte ", at, " fails its CRC");
    EventRecord e;
    MOE_CHECK(parse_event(data, e.step, e.summary), "TensorBoard event file '", path,
              "' is corrupt: the record at byte ", at, " is not an Event");
    e.offset = at;
    e.size = 12 + length + 4;
    events.push_back(e);
    at += e.size;
  }
  if (tail_offset) *tail_offset = at;
  return events;
}

bool tensorboard_events_after(const std::string& dir, int64_t step) {
  for (const std::string& path : event_files(dir)) {
    const std::string bytes = read_whole_file(path, "TensorBoard event file");
    for (const EventRecord& e : read_event_records(path, bytes, nullptr))
      if (e.summary && e.step > step) return true;
  }
  return false;
}

int64_t move_tensorboard_events_after(const std::string& dir, int64_t step, const std::string& dest_dir) {
  int64_t moved_events = 0;
  const std::string dest_tb = dest_dir + "/tensorboard";
  for (const std::string& path : event_files(dir)) {
    const std::string bytes = read_whole_file(path, "TensorBoard event file");
    size_t tail = 0;
    const std::vector<EventRecord> events = read_event_records(path, bytes, &tail);
    std::string kept, moved;
    int64_t n = 0;
    bool keeps_scalars = false;
    for (const EventRecord& e : events) {
      const std::string_view rec(bytes.data() + e.offset, e.size);
      if (e.summary && e.step > step) {
        moved += rec;
        ++n;
      } else {
        kept += rec;
        keeps_scalars = keeps_scalars || e.summary;
      }
    }
    if (n == 0) continue;
    std::error_code ec;
    fs::create_directories(dest_tb, ec);
    MOE_CHECK(!ec, "cannot create ", dest_tb, ": ", ec.message());
    const std::string name = fs::path(path).filename().string();
    if (!keeps_scalars) {
      // Every scalar of this file belongs to the abandoned line: the file moves as it is.
      move_entries(dir, {name}, dest_tb);
    } else {
      // The copy first, then the shortened file: a crash in between leaves the events in both
      // places (the move runs again and rewrites the same copy), never in neither.
      const bool starts_with_version = !events.empty() && !events.front().summary;
      const std::string version = starts_with_version ? bytes.substr(events.front().offset, events.front().size)
                                                      : tfrecord(file_version_event(unix_seconds()));
      write_file_atomic(dest_tb + "/" + name, version + moved);
      rewrite_file_atomic(path, kept + bytes.substr(tail));  // a cut-off last record stays where it was
    }
    moved_events += n;
  }
  if (moved_events > 0) {
    fsync_dir(dest_tb);
    fsync_dir(dir);
  }
  return moved_events;
}

}  // namespace moe
