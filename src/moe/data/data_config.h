// DataConfig: the [data] section of a run config (and EvalSetConfig, the [[eval.sets]] entries).
// Plain values; the train area parses TOML into them and TokenDataset::open validates them
// (errors name the config key).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

// One training source of a mixture ([[data.sources]]).
struct DataSource {
  std::string path;     // a token file, a folder of them, or a glob ("data/*.npy")
  double weight = 1.0;  // relative share of the training instances each epoch
};

struct DataConfig {
  std::string path = "synthetic";  // one source (a file, folder or glob), or "synthetic"
  std::vector<DataSource> sources;  // several sources with mixture weights (instead of path)
  std::string format = "npy";       // npy: .npy files with a header; raw: headerless token arrays (OLMo-core, Dolma)
  std::string dtype = "uint16";     // raw files' token type: uint16 | uint32
  std::string sampling = "epoch";   // epoch: shuffled fixed instances, each once per epoch; random: windows with replacement
  uint64_t seed = 1234;             // sampling + synthetic generation seed
  double eval_fraction = 0.05;      // held-out tail of every file (real data), in [0, 1)
  int64_t synthetic_tokens = 1 << 21;  // training-stream length of the synthetic corpus
  int64_t synthetic_eval_tokens = 1 << 17;
  int64_t synthetic_domains = 4;
  int64_t synthetic_successors = 6;  // distinct likely next tokens per token inside a domain
  double synthetic_doc_end_prob = 0.01;  // in [0.001, 1)
};

// A named validation set ([[eval.sets]]): every token of `path` (a file, folder or glob, read
// in data.format) is held out; its loss is reported under `name`.
struct EvalSetConfig {
  std::string name;
  std::string path;
};

}  // namespace moe
