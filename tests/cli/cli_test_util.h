// Shared fixture for command-line tests: runs the real moetrain binary in a fresh temp dir
// and captures its exit status, stdout and stderr.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace cli_testing {

struct CliRun {
  int exit_code = -1;  // the exit status, or 128 + signal when the process was killed
  std::string out, err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// A .npy version 1.0 file of uint16 tokens. `declared` is the length the header claims (the
// real length when < 0), so a file can claim more tokens than it holds.
inline std::string npy_u16(const std::vector<uint16_t>& tokens, int64_t declared = -1) {
  const int64_t n = declared < 0 ? static_cast<int64_t>(tokens.size()) : declared;
  std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
  // magic (6) + version (2) + header length (2) + dict + padding + '\n' is a multiple of 64.
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(dict.size() & 0xff);
  bytes += static_cast<char>(dict.size() >> 8);
  bytes += dict;
  for (uint16_t t : tokens) {
    bytes += static_cast<char>(t & 0xff);
    bytes += static_cast<char>(t >> 8);
  }
  return bytes;
}

// Tokens below the tiny config's vocabulary (512) with some structure to learn.
inline std::vector<uint16_t> valid_tokens(int64_t n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>((i * 7 + i / 13) % 511);
  return tokens;
}

inline int count_lines(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moe-cli-test-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    ASSERT_NE(p, nullptr) << "mkdtemp failed";
    tmp_ = p;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  std::string path(const std::string& name) const { return tmp_ + "/" + name; }
  std::string run_dir() const { return path("run"); }

  // Runs the built binary with `args`, in the temp dir, stdout and stderr captured to files.
  CliRun moetrain(const std::vector<std::string>& args) {
    std::vector<std::string> argv_strings = {MOE_BINARY_DIR "/moetrain"};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    return run(std::move(argv_strings));
  }
  // Runs the program argv_strings[0] (a path) the same way, e.g. a shell that sets a limit first.
  CliRun run(std::vector<std::string> argv_strings) {
    const std::string out_path = path(".stdout"), err_path = path(".stderr");
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0 || ::chdir(tmp_.c_str()) != 0) ::_exit(126);
      ::alarm(120);  // a hung run is killed (SIGALRM survives exec) instead of hanging the suite
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    CliRun r;
    if (pid < 0) {
      ADD_FAILURE() << "fork failed";
      return r;
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_file(out_path);
    r.err = read_file(err_path);
    std::error_code ec;
    fs::remove(out_path, ec);
    fs::remove(err_path, ec);
    return r;
  }

  // The overrides that make a run tiny, as "key=value" (without run.dir).
  static std::vector<std::string> tiny_sets() {
    return {"train.steps=1",          "model.hidden_size=16",        "model.intermediate_size=32",
            "train.seq_len=16",       "train.micro_batch_size=2",    "train.global_batch_size=2",
            "train.warmup_steps=1",   "data.synthetic_tokens=20000", "data.synthetic_eval_tokens=2000",
            "train.eval_batches=2",   "run.device=cpu"};  // pinned: these tests also run on GPU machines
  }
  // `moetrain train` with the tiny overrides, run.dir = <tmp>/run, and `extra` arguments after.
  std::vector<std::string> tiny_train(const std::vector<std::string>& extra = {},
                                      const std::vector<std::string>& sets = tiny_sets()) const {
    std::vector<std::string> args = {"train", "--set", "run.dir=" + run_dir()};
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // The tiny config file with `from` replaced by `to` (a config-file case without other faults).
  std::string tiny_toml_with(const std::string& from, const std::string& to) const {
    std::string text = read_file(MOE_SOURCE_DIR "/configs/tiny.toml");
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << "configs/tiny.toml no longer contains '" << from << "'";
    if (at != std::string::npos) text.replace(at, from.size(), to);
    return text;
  }

  std::vector<std::string> step_dirs(const std::string& dir) const {
    std::vector<std::string> names;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return names;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("step-", 0) == 0) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string tmp_;
};

// Exit status 1, stderr starts with "error: " and contains every needle; with one_line, the
// message is a single line.
inline void expect_error(const CliRun& r, const std::vector<std::string>& needles, bool one_line = true) {
  EXPECT_EQ(r.exit_code, 1) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << "stderr does not start with 'error: ':\n" << r.err;
  if (one_line) {
    EXPECT_EQ(count_lines(r.err), 1) << "expected one error line, got:\n" << r.err;
  }
  for (const std::string& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "stderr lacks '" << n << "':\n" << r.err;
}

inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}


}  // namespace cli_testing

using namespace cli_testing;  // NOLINT: test helpers
