// TensorBoard event files (trainer.logger: tensorboard), written without
// TensorFlow or protobuf: a TFRecord file of serialized `Event` messages, as
// TensorBoard's own writer makes them.
//
// The file: <dir>/events.out.tfevents.<seconds>.<host>.<pid>.0. Each record
// is [length: uint64 LE][masked CRC-32C of the length: uint32 LE][data]
// [masked CRC-32C of the data: uint32 LE] (masked: ((crc >> 15) | (crc << 17))
// + 0xa282ead8). The first record is an Event with file_version
// "brain.Event:2"; each add() is an Event {wall_time, step, summary {value
// {tag, simple_value}...}}: TensorBoard's scalars, one per metric.
//
// Example:
//   TensorBoardWriter tb("tensorboard_log/project/experiment");
//   tb.add(1, {{"critic/score/mean", 0.5}, {"actor/pg_loss", -0.1}});
//   tb.flush();
//
// Not thread-safe (the trainer's one logger).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>

namespace baton::trainer {

// CRC-32C (Castagnoli) of `data`, and TFRecord's mask of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it. Throws baton::Error naming the
  // path when either cannot be made.
  explicit TensorBoardWriter(const std::filesystem::path& dir);

  // One Event at `step` with a scalar per metric (NaN and ±inf are written
  // as they are: TensorBoard shows them). Throws baton::Error when the file
  // cannot be written.
  void add(int64_t step, const std::map<std::string, double>& scalars);
  void flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace baton::trainer
