// moetrain prepare: text files into byte-level .npy token files and the dataset.json that lists them.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "moe/data/prepare.h"

namespace moe::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string out;
  bool append = false;
};

int run_prepare(const PrepareArgs& a) {
  const moe::PrepareResult r = moe::prepare_byte_level(a.inputs, a.out, a.append);
  for (const auto& f : r.files)
    std::printf("%s -> %s/%s: %ld tokens, %ld documents\n", f.source.c_str(), r.out_dir.c_str(), f.name.c_str(),
                static_cast<long>(f.tokens), static_cast<long>(f.documents));
  std::printf("wrote %ld tokens (vocab %ld, EOS %ld) and %s/dataset.json, which lists %ld file%s\n",
              static_cast<long>(r.total_tokens), static_cast<long>(moe::kByteVocabSize),
              static_cast<long>(moe::kByteEosTokenId), r.out_dir.c_str(), static_cast<long>(r.listed_files),
              r.listed_files == 1 ? "" : "s");
  return 0;
}

}  // namespace

Command add_prepare_command(CLI::App& app) {
  auto a = std::make_shared<PrepareArgs>();
  CLI::App* prepare = app.add_subcommand("prepare", "turn text files into byte-level .npy token files");
  prepare->add_option("files", a->inputs, "text files")->required();
  prepare->add_option("--out", a->out, "output folder: new or empty, unless --append")->required();
  prepare->add_flag("--append", a->append,
                    "add the files to the dataset already in --out (written by prepare); existing files are never "
                    "overwritten");
  return {prepare, [a](Job&) { return run_prepare(*a); }, /*agreed_flags=*/nullptr, /*one_process=*/true};
}

}  // namespace moe::cli
