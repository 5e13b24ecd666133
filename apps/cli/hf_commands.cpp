// moetrain export-hf and import-hf: a checkpoint to and from a Hugging Face OLMoE directory.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli/arguments.h"
#include "cli/command.h"
#include "moe/core/arena.h"
#include "moe/train/hf_interop.h"

namespace moe::cli {

namespace {

struct ExportArgs {
  std::string checkpoint, out;
  double shard_gb = 5.0;
  std::vector<std::string> tokenizer;
  std::string dtype = "f32";
};

// Says how far a long export or import is, at most every 10 s (nothing for one that takes less):
// a 7B model moves ~28 GB, minutes of silence otherwise.
moe::HfProgress progress_lines(const char* command, const char* verb) {
  const auto start = std::chrono::steady_clock::now();
  auto said_at = std::make_shared<double>(0.0);
  return [=](int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s - *said_at < 10.0 || done >= total) return;
    *said_at = s;
    std::printf("%s: %s of %s %s (%.0f%%, %.0f s)\n", command, moe::format_bytes(static_cast<double>(done)).c_str(),
                moe::format_bytes(static_cast<double>(total)).c_str(), verb,
                100.0 * static_cast<double>(done) / static_cast<double>(total), s);
    std::fflush(stdout);
  };
}

int run_export(const ExportArgs& a) {
  if (!std::isfinite(a.shard_gb)) {  // CLI::Range lets NaN through
    std::fprintf(stderr, "error: --max-shard-gb: %g is not a number of GB (see moetrain --help)\n", a.shard_gb);
    return kUsageError;
  }
  const bool bf16 = a.dtype == "bf16";
  const moe::ExportResult r = moe::export_hf(a.checkpoint, a.out, static_cast<int64_t>(a.shard_gb * 1e9), a.tokenizer,
                                             bf16 ? moe::DType::BF16 : moe::DType::F32,
                                             progress_lines("export-hf", "written"));
  std::printf("exported %ld tensors (%s, %s) in %d shard(s) to %s; peak resident memory %s\n",
              static_cast<long>(r.tensors), moe::format_bytes(static_cast<double>(r.bytes)).c_str(),
              bf16 ? "bfloat16" : "float32", r.shards, r.out_dir.c_str(),
              moe::format_bytes(static_cast<double>(r.peak_rss_bytes)).c_str());
  for (const std::string& note : r.notes) std::printf("  note: %s\n", note.c_str());
  return 0;
}

struct ImportArgs {
  std::string hf_dir, out;
};

// A path as one shell word: as it is when it holds only plain characters, else in single quotes
// (the printed command is meant to be pasted; "io/my run" split into two arguments).
std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("/._-+:=@%,", c) != nullptr;
  });
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int run_import(const ImportArgs& a) {
  const moe::ImportResult r = moe::import_hf(a.hf_dir, a.out, progress_lines("import-hf", "of weights read"));
  std::printf("imported %ld tensors (%s expert layout) into %s\n  config: %s\n  AdamW moments start at zero.\n"
              "  continue with: moetrain train --config %s --resume %s\n",
              static_cast<long>(r.tensors), r.fused_experts ? "fused" : "per-expert", r.checkpoint_dir.c_str(),
              r.config_path.c_str(), shell_word(r.config_path).c_str(), shell_word(r.checkpoint_dir).c_str());
  return 0;
}

}  // namespace

Command add_export_hf_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* export_hf =
      app.add_subcommand("export-hf", "write a checkpoint as a Hugging Face OlmoeForCausalLM directory");
  export_hf->add_option("checkpoint", a->checkpoint, "checkpoint dir (or run dir)")->required()->check(kNonEmpty);
  export_hf->add_option("out", a->out, "output directory (must not exist)")->required()->check(kNonEmpty);
  export_hf->add_option("--max-shard-gb", a->shard_gb, "largest safetensors shard, GB")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  export_hf->add_option("--tokenizer", a->tokenizer, "tokenizer files to copy in (tokenizer.json, ...)")
      ->check(kNonEmpty);
  export_hf
      ->add_option("--dtype", a->dtype, "dtype of the exported weights: f32, or bf16 (rounded to nearest even)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  return {export_hf, [a](Job&) { return run_export(*a); }, /*agreed_flags=*/nullptr, /*one_process=*/true};
}

Command add_import_hf_command(CLI::App& app) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* import_hf =
      app.add_subcommand("import-hf", "turn a Hugging Face OLMoE directory into a moetrain checkpoint");
  import_hf->add_option("hf_dir", a->hf_dir, "directory with config.json and safetensors")
      ->required()
      ->check(kNonEmpty);
  import_hf->add_option("out", a->out, "run directory to create (step-000000/ and config.toml)")
      ->required()
      ->check(kNonEmpty);
  return {import_hf, [a](Job&) { return run_import(*a); }, /*agreed_flags=*/nullptr, /*one_process=*/true};
}

}  // namespace moe::cli
