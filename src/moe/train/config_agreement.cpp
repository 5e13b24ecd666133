#include "moe/train/config_agreement.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moe/comm/host_strings.h"
#include "moe/core/error.h"
#include "moe/core/rng.h"

namespace moe {


void check_config_agrees(const Config& cfg, Communicator& host) {
  if (host.size() == 1) return;
  const std::string text = config_to_toml(cfg);
  const uint64_t h = hash_string(text);  // stable across processes and builds
  // Four 16-bit parts and their complements: one Max reduction gives each part's max and min.
  int32_t parts[8];
  for (int i = 0; i < 4; ++i) {
    parts[i] = static_cast<int32_t>((h >> (16 * i)) & 0xffff);
    parts[4 + i] = 0xffff - parts[i];
  }
  host.all_reduce(Tensor(parts, DType::I32, {8}), ReduceOp::Max);
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && parts[i] == 0xffff - parts[4 + i];
  if (same) return;
  const std::vector<std::string> all = all_gather_strings(host, text);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const Config theirs = parse_config(all[r], "the config of rank " + std::to_string(r));
    const Config leader = parse_config(all[0], "the config of rank 0");
    const auto a = config_values(leader), b = config_values(theirs);
    const std::map<std::string, std::string> in_b(b.begin(), b.end());
    for (const auto& [key, value] : a) {
      const auto it = in_b.find(key);
      const std::string other = it == in_b.end() ? "(none)" : it->second;
      MOE_CHECK(value == other, "the ranks of this job were given different configs: ", key, " = ", value,
                " on rank 0 but ", other, " on rank ", r,
                " (every rank must get the same --config file, --set overrides and flags)");
    }
  }
  MOE_FAIL("the ranks of this job were given different configs (every rank must get the same --config file, --set "
           "overrides and flags)");
}

}  // namespace moe
