// The lines train and bench print when the run ends.
#pragma once

#include "moe/train/trainer.h"

namespace moe::cli {

// The last step's loss, the held-out losses, throughput, MFU and memory; with `bench`, the spread
// of the step times too.
void print_summary(const moe::TrainSummary& s, bool bench);

}  // namespace moe::cli
