// A token file truncated while training reads it through its memory map: the read past its new
// end raises SIGBUS, which ends the process with status 1 and one error naming the file and what
// to do (core/mapped_file_faults.h), not a silent kill.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/data/npy.h"
#include "moe/data/token_array.h"

namespace moe {
namespace {

TEST(TokenFileFault, a_token_file_truncated_while_mapped_is_named_and_the_process_exits_1) {
  char tmpl[] = "/tmp/moe-token-fault-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/tokens.npy";
  const std::vector<uint32_t> tokens(1 << 18, 7u);  // 1 MiB: pages past the cut
  write_npy(path, tokens);
  // The default death-test style forks: the child maps the file this test wrote.
  EXPECT_EXIT(
      {
        const TokenArray t = TokenArray::open_npy(path);
        if (::truncate(path.c_str(), 4096) != 0) ::_exit(3);
        volatile uint32_t last = t.at(t.size() - 1);
        (void)last;
        ::_exit(4);  // the read did not fault
      },
      ::testing::ExitedWithCode(1),
      "^error: " + path +
          " could not be read \\(SIGBUS\\): it was truncated or replaced while moetrain read it; "
          "restore it and resume from the last checkpoint\n$");
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace moe
