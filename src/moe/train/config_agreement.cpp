#include "moe/train/config_agreement.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moe/comm/host_strings.h"
#include "moe/core/error.h"

namespace moe {
void check_config_agrees(const Config& cfg, Communicator& host) {
  const StringAgreement a = agree_on_string(host, config_to_toml(cfg));
  if (a.differing_rank < 0) return;
  const int r = a.differing_rank;
  const Config theirs = parse_config(a.differing, "the config of rank " + std::to_string(r));
  const Config leader = parse_config(a.leader, "the config of rank 0");
  const auto lv = config_values(leader), tv = config_values(theirs);
  const std::map<std::string, std::string> in_theirs(tv.begin(), tv.end());
  for (const auto& [key, value] : lv) {
    const auto it = in_theirs.find(key);
    const std::string other = it == in_theirs.end() ? "(none)" : it->second;
    MOE_CHECK_AGREED(value == other, "the ranks of this job were given different configs: ", key, " = ", value,
              " on rank 0 but ", other, " on rank ", r,
              " (every rank must get the same --config file, --set overrides and flags)");
  }
  MOE_FAIL_AGREED("the ranks of this job were given different configs (every rank must get the same --config file, --set "
           "overrides and flags)");
}

}  // namespace moe
