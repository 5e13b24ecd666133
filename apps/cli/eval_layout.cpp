#include "cli/eval_layout.h"

#include <algorithm>

namespace moe::cli {

std::vector<std::string> eval_layout_sets() {
  return {"parallel.mode=ddp",         "parallel.pp=1",         "parallel.pp_virtual=1",
          "parallel.pp_schedule=1f1b", "parallel.pp_layers=[]", "train.recompute=block"};
}

void settle_eval_layout(Config& cfg, int world, const std::vector<std::string>& overrides) {
  cfg.train.global_batch_size = cfg.train.micro_batch_size * world;
  const bool ep_given = std::any_of(overrides.begin(), overrides.end(),
                                    [](const std::string& o) { return override_key(o) == "parallel.ep"; });
  const int64_t stage_ranks = cfg.parallel.pp >= 1 && world % cfg.parallel.pp == 0 ? world / cfg.parallel.pp : world;
  if (!ep_given && (cfg.parallel.mode == "fsdp" || cfg.parallel.ep > stage_ranks || stage_ranks % cfg.parallel.ep != 0))
    cfg.parallel.ep = 1;
}

}  // namespace moe::cli
