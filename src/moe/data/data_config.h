// DataConfig: the [data] section of a run config. Plain values; the train area parses TOML
// into it and TokenDataset::open validates it (errors name the config key).
#pragma once

#include <cstdint>
#include <string>

namespace moe {

struct DataConfig {
  std::string path = "synthetic";  // a folder of .npy token files, or "synthetic"
  uint64_t seed = 1234;            // sampling + synthetic generation seed
  double eval_fraction = 0.05;     // held-out tail of every file (real data), in [0, 1)
  int64_t synthetic_tokens = 1 << 21;  // training-stream length of the synthetic corpus
  int64_t synthetic_eval_tokens = 1 << 17;
  int64_t synthetic_domains = 4;
  int64_t synthetic_successors = 6;  // distinct likely next tokens per token inside a domain
  double synthetic_doc_end_prob = 0.01;  // in [0.001, 1)
};

}  // namespace moe
