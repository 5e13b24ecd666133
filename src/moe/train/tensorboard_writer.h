// TensorBoard event files, written without TensorFlow: with run.tensorboard = true rank 0 writes
// every metrics record as scalars to <run.dir>/tensorboard/events.out.tfevents.<unix time>.<host>.<pid>
// (one file per process start), which `tensorboard --logdir <run.dir>/tensorboard` reads.
//
// The file is a sequence of TFRecords, each a serialized tensorboard.Event protobuf:
//   record := uint64 length | uint32 masked CRC-32C of the 8 length bytes | data | uint32 masked CRC-32C of data
//   (little-endian; masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8)
//   the first event carries file_version "brain.Event:2"; every later one wall_time, step and a
//   Summary of Value{tag, simple_value (float)}.
//
// NOTES: the three messages (Event, Summary, Summary.Value) are encoded here by hand, a few dozen
// lines of protobuf wire format; a protobuf dependency (compiler, runtime and TensorFlow's .proto
// files) for three fixed messages would cost far more than it saves. The CRC comes from a library
// (ISA-L's crc32_iscsi: Debian 12 has no package of Google's crc32c).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moe {

// CRC-32C (Castagnoli) of `bytes`, and the masked form TFRecords store.
uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);

// `data` framed as one TFRecord.
std::string tfrecord(std::string_view data);

using Scalars = std::vector<std::pair<std::string, float>>;

// Serialized tensorboard.Event messages: the first event of a file, and one carrying scalars.
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars);

// The scalars of one metrics.jsonl record, tagged with their keys: every number (the strings
// "nan", "inf" and "-inf" stand for non-finite ones), booleans as 0/1, and a list as one scalar
// per element (expert_load_max_over_mean_per_layer as expert_load/layer_<i>), the validation sets'
// losses ("eval_sets": {name: loss}) as eval_loss/<name>. "step" is the
// event's step, not a scalar; other strings (time, run_id) are left out.
Scalars record_scalars(const nlohmann::json& record);

// Appends one event per metrics record to a new event file in `dir`. Nothing is created before
// the first write (a run that fails before its first logged step leaves no file). An event is
// written whole or not at all: a failed or short write (a full disk) is cut back off before the
// error, which names the file, is raised.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(std::string dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void write(const nlohmann::json& record);  // record_scalars(record) at record["step"]
  const std::string& path() const { return path_; }  // "" before the first write

 private:
  void open(double wall_time);
  void append(const std::string& bytes);

  std::string dir_, path_;
  int fd_ = -1;
};

// One event of an event file: its step, whether it carries a summary, and its record's bytes.
struct EventRecord {
  int64_t step = 0;
  bool summary = false;
  size_t offset = 0, size = 0;  // the whole framed record within the file
};

// Reads the events of an event file's bytes. A record cut off at the end (a crash mid-write)
// ends the list, and *tail_offset says where it starts (the file's size when there is none); a
// record whose CRC or protobuf does not check is an error naming `path`.
std::vector<EventRecord> read_event_records(const std::string& path, std::string_view bytes, size_t* tail_offset);

// The set-aside of an abandoned line (a resume from an older step; see ckpt/run_checkpoints.h):
// whether an event file in `dir` holds an event of a step after `step`, and moving those events
// into dest_dir/tensorboard/<same file name> (after a file_version event) while the kept events
// are rewritten atomically; a file that keeps no scalars moves whole. Idempotent. Returns the
// number of events moved.
bool tensorboard_events_after(const std::string& dir, int64_t step);
int64_t move_tensorboard_events_after(const std::string& dir, int64_t step, const std::string& dest_dir);

}  // namespace moe
