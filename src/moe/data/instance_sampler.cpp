#include "moe/data/instance_sampler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "moe/core/error.h"
#include "moe/core/rng.h"
#include "moe/data/shuffle.h"

namespace moe {

namespace {
constexpr uint64_t kEpochStream = 0x4550'4f43'4800ull;  // "EPOCH"
constexpr uint64_t kPassStream = 0x5041'5353'0000ull;   // "PASS"
}  // namespace

InstanceSampler::InstanceSampler(const TokenDataset& data, int64_t seq_len, int64_t global_batch, uint64_t seed)
    : data_(data), seq_len_(seq_len), global_batch_(global_batch), seed_(seed) {
  MOE_CHECK(seq_len >= 1 && global_batch >= 1, "InstanceSampler: seq_len and global_batch must be >= 1");
  const int64_t width = seq_len + 1;
  int64_t total = 0;
  double total_weight = 0;
  for (const TokenDataset::Source& src : data.mixture()) {
    SourceInstances s;
    s.first_instance.assign(1, 0);
    for (size_t f : src.files) {
      const int64_t n = data.files()[f].train_length / width;
      if (n == 0) continue;
      s.files.push_back(f);
      s.first_instance.push_back(s.first_instance.back() + n);
    }
    s.count = s.first_instance.back();
    MOE_CHECK(s.count > 0, src.key, " (", src.path, ") holds no instance of seq_len + 1 = ", width, " tokens");
    total += s.count;
    total_weight += src.weight;
    sources_.push_back(std::move(s));
  }
  epoch_offsets_.assign(1, 0);
  for (size_t i = 0; i < sources_.size(); ++i) {
    const double share = data.mixture()[i].weight / total_weight * static_cast<double>(total);
    sources_[i].per_epoch = sources_.size() == 1 ? sources_[i].count : std::max<int64_t>(1, std::llround(share));
    epoch_offsets_.push_back(epoch_offsets_.back() + sources_[i].per_epoch);
  }
  epoch_size_ = epoch_offsets_.back();
}

InstanceSampler::Instance InstanceSampler::instance(uint64_t g) const {
  const uint64_t epoch = g / static_cast<uint64_t>(epoch_size_), at = g % static_cast<uint64_t>(epoch_size_);
  const uint64_t slot = Shuffle(static_cast<uint64_t>(epoch_size_), seed_, hash_counters(kEpochStream, epoch))(at);
  const size_t s = static_cast<size_t>(
      std::upper_bound(epoch_offsets_.begin(), epoch_offsets_.end(), static_cast<int64_t>(slot)) - epoch_offsets_.begin() - 1);
  const SourceInstances& src = sources_[s];
  // The source's draws form passes, each a fresh shuffle of all its instances.
  const uint64_t draw = epoch * static_cast<uint64_t>(src.per_epoch) + (slot - static_cast<uint64_t>(epoch_offsets_[s]));
  const uint64_t pass = draw / static_cast<uint64_t>(src.count), within = draw % static_cast<uint64_t>(src.count);
  const int64_t k = static_cast<int64_t>(
      Shuffle(static_cast<uint64_t>(src.count), seed_, hash_counters(kPassStream, s, pass))(within));
  const size_t i = static_cast<size_t>(
      std::upper_bound(src.first_instance.begin(), src.first_instance.end(), k) - src.first_instance.begin() - 1);
  const size_t file = src.files[i];
  return {file, data_.files()[file].train_begin + (k - src.first_instance[i]) * (seq_len_ + 1)};
}

void InstanceSampler::batch(int64_t step, int64_t first_seq, int64_t n_seqs, int32_t* inputs, int32_t* targets) const {
  MOE_CHECK(step >= 0 && first_seq >= 0 && n_seqs >= 0 && first_seq + n_seqs <= global_batch_,
            "InstanceSampler::batch: sequences [", first_seq, ", ", first_seq + n_seqs, ") of step ", step,
            " outside the global batch of ", global_batch_);
  for (int64_t r = 0; r < n_seqs; ++r) {
    const Instance in = instance(static_cast<uint64_t>(step) * static_cast<uint64_t>(global_batch_) +
                                 static_cast<uint64_t>(first_seq + r));
    data_.copy_window(in.file, in.start, seq_len_, inputs + r * seq_len_, targets + r * seq_len_);
  }
}

double InstanceSampler::epochs_after(int64_t steps) const {
  return static_cast<double>(steps) * static_cast<double>(global_batch_) / static_cast<double>(epoch_size_);
}

std::string InstanceSampler::describe() const {
  std::ostringstream os;
  os << "sampling: epochs of " << epoch_size_ << " shuffled instances of " << seq_len_ + 1 << " tokens ("
     << static_cast<double>(epoch_size_) / static_cast<double>(global_batch_) << " steps each)";
  if (sources_.size() > 1) {
    os << "; per epoch";
    for (size_t i = 0; i < sources_.size(); ++i)
      os << (i ? "," : "") << " " << data_.mixture()[i].path << " " << sources_[i].per_epoch << " of "
         << sources_[i].count;
  }
  return os.str();
}

}  // namespace moe
