// Test helper for tests/python/checkpoint_reader_test.py: reads every tensor of a checkpoint with
// the C++ CheckpointReader (the reader training uses) and writes its stored bytes to
// <out>/<name>.bin, plus <out>/manifest.json {"step": S, "tensors": {name: {"dtype", "shape"}}},
// so the Python reader's tensors can be compared with it bit for bit.
//
//   checkpoint_dump CHECKPOINT_DIR OUT_DIR
//
// Errors (a checksum mismatch, say) are printed as one "error: ..." line with exit status 1.
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_dump CHECKPOINT_DIR OUT_DIR\n");
    return 2;
  }
  try {
    const moe::CheckpointReader ckpt(argv[1]);
    const std::string out = argv[2];
    nlohmann::json tensors = nlohmann::json::object();
    std::vector<unsigned char> bytes;
    for (const std::string& key : ckpt.keys()) {
      const std::vector<int64_t> shape = ckpt.global_shape(key);
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      bytes.resize(static_cast<size_t>(numel) * moe::dtype_size(ckpt.dtype(key)));
      ckpt.read(key, 0, numel, bytes.data());
      std::ofstream f(out + "/" + key + ".bin", std::ios::binary);
      f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      if (!f.good()) throw std::runtime_error("cannot write " + out + "/" + key + ".bin");
      tensors[key] = {{"dtype", std::string(moe::dtype_name(ckpt.dtype(key)))}, {"shape", shape}};
    }
    std::ofstream m(out + "/manifest.json");
    m << nlohmann::json({{"step", ckpt.step()}, {"tensors", tensors}}).dump(1) << "\n";
    if (!m.good()) throw std::runtime_error("cannot write " + out + "/manifest.json");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
