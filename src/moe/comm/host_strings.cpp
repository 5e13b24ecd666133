#include "moe/comm/host_strings.h"

#include <algorithm>
#include <cstring>

#include "moe/core/error.h"
#include "moe/core/rng.h"

namespace moe {

namespace {

// Bytes packed into I32 words (the collectives' unit), zero-padded to `words` words.
std::vector<int32_t> pack(const std::string& s, size_t words) {
  std::vector<int32_t> w(words, 0);
  std::memcpy(w.data(), s.data(), s.size());
  return w;
}

size_t words_for(size_t bytes) { return (bytes + sizeof(int32_t) - 1) / sizeof(int32_t); }

int32_t checked_length(const std::string& s) {
  MOE_CHECK(s.size() < (size_t{1} << 30), "host collective: a message of ", s.size(), " bytes is too long");
  return static_cast<int32_t>(s.size());
}

}  // namespace

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  int32_t my_length = checked_length(mine);
  std::vector<int32_t> lengths(static_cast<size_t>(n));
  comm.all_gather(Tensor(lengths.data(), DType::I32, {n}), Tensor(&my_length, DType::I32, {1}));
  const size_t words = words_for(static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end())));
  std::vector<std::string> out(static_cast<size_t>(n));
  if (words == 0) return out;
  std::vector<int32_t> packed = pack(mine, words), all(words * static_cast<size_t>(n));
  comm.all_gather(Tensor(all.data(), DType::I32, {static_cast<int64_t>(all.size())}),
                  Tensor(packed.data(), DType::I32, {static_cast<int64_t>(words)}));
  for (int r = 0; r < n; ++r)
    out[static_cast<size_t>(r)].assign(reinterpret_cast<const char*>(all.data() + static_cast<size_t>(r) * words),
                                       static_cast<size_t>(lengths[static_cast<size_t>(r)]));
  return out;
}

std::string broadcast_string(Communicator& comm, const std::string& text, int root) {
  int32_t length = comm.rank() == root ? checked_length(text) : 0;
  comm.broadcast(Tensor(&length, DType::I32, {1}), root);
  const size_t words = words_for(static_cast<size_t>(length));
  if (words == 0) return "";
  std::vector<int32_t> packed = comm.rank() == root ? pack(text, words) : std::vector<int32_t>(words, 0);
  comm.broadcast(Tensor(packed.data(), DType::I32, {static_cast<int64_t>(words)}), root);
  return std::string(reinterpret_cast<const char*>(packed.data()), static_cast<size_t>(length));
}

StringAgreement agree_on_string(Communicator& comm, const std::string& text) {
  StringAgreement a;
  if (comm.size() == 1) return a;
  const uint64_t h = hash_string(text);
  // Four 16-bit parts and their complements: one Max reduction gives each part's max and min.
  int32_t parts[8];
  for (int i = 0; i < 4; ++i) {
    parts[i] = static_cast<int32_t>((h >> (16 * i)) & 0xffff);
    parts[4 + i] = 0xffff - parts[i];
  }
  comm.all_reduce(Tensor(parts, DType::I32, {8}), ReduceOp::Max);
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && parts[i] == 0xffff - parts[4 + i];
  if (same) return a;
  const std::vector<std::string> all = all_gather_strings(comm, text);
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) {
      a.differing_rank = static_cast<int>(r);
      a.leader = all[0];
      a.differing = all[r];
      break;
    }
  return a;
}

}  // namespace moe
