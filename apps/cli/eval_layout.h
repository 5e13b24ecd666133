// How `moetrain eval` lays out a checkpoint's config on its ranks, shared with `moetrain plan
// --eval`, so the plan is of the layout the evaluation runs.
#pragma once

#include <string>
#include <vector>

#include "moe/train/config.h"

namespace moe::cli {

// The assignments eval applies before the user's --set (which may ask for a layout again):
// whole-model DDP ranks, as pipeline stages and FSDP are training layouts, and block recompute,
// since no backward runs (it keeps each layer's input only and gives the same forward).
std::vector<std::string> eval_layout_sets();

// After parsing, for `world` ranks: one microbatch per rank at a time, and the config's EP where
// the ranks can hold it (it must divide a pipeline stage's ranks; FSDP keeps every expert on every
// rank), else 1. An EP the user gave (`overrides` names parallel.ep) is kept: validate() names it
// if it does not fit.
void settle_eval_layout(Config& cfg, int world, const std::vector<std::string>& overrides);

}  // namespace moe::cli
