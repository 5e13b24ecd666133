// A safetensors file (a checkpoint's rank file, a Hugging Face weights file) truncated while it is
// memory-mapped: the read past its new end raises SIGBUS, which now ends the process with status 1
// and one error naming the file, where it used to kill it with no word. A SIGBUS that is not a
// fault in a watched mapping still gets the action it had before (the default, or ignored).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/ckpt/safetensors.h"
#include "moe/core/mapped_file_faults.h"
#include "temp_dir.h"

namespace moe {
namespace {

using moe::testing::TempDir;

// One F32 tensor "w" of n elements, in dir/name.
std::string write_tensor_file(const TempDir& dir, int64_t n, const std::string& name = "rank-00000.safetensors") {
  const std::string path = dir / name;
  SafetensorsWriter w;
  w.add("w", DType::F32, {n});
  w.open(path);
  const std::vector<float> values(static_cast<size_t>(n), 1.5f);
  w.write(values.data(), values.size() * sizeof(float));
  w.finish();
  return path;
}

// The default ("fast") death tests fork here, so the child sees this test's temp files (the
// "threadsafe" style would re-run the test body and make other ones).
class MappedFileFault : public ::testing::Test {};

TEST_F(MappedFileFault, a_file_truncated_while_mapped_is_named_and_the_process_exits_1) {
  TempDir dir;
  const int64_t n = 1 << 18;  // 1 MiB of data: pages past the cut
  const std::string path = write_tensor_file(dir, n);
  EXPECT_EXIT(
      {
        SafetensorsReader f(path);
        if (::truncate(path.c_str(), 4096) != 0) ::_exit(3);
        const auto* w = static_cast<const volatile float*>(f.data("w"));
        volatile float last = w[n - 1];
        (void)last;
        ::_exit(4);  // the read did not fault
      },
      ::testing::ExitedWithCode(1),
      "^error: " + path +
          " could not be read \\(SIGBUS\\): it was truncated or replaced while moetrain read it; "
          "restore it \\(or resume from another checkpoint\\) and run again\n$");
}

TEST_F(MappedFileFault, a_sigbus_that_is_no_fault_in_a_watched_file_keeps_the_default_action) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer the previous SIGBUS action is its own report, not the default";
#endif
  TempDir dir;
  const std::string path = write_tensor_file(dir, 1024);
  EXPECT_EXIT(
      {
        SafetensorsReader f(path);
        ::raise(SIGBUS);
        ::_exit(4);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST_F(MappedFileFault, an_ignored_sigbus_stays_ignored) {
  TempDir dir;
  const std::string path = write_tensor_file(dir, 1024);
  EXPECT_EXIT(
      {
        ::signal(SIGBUS, SIG_IGN);
        SafetensorsReader f(path);  // installs the handler over SIG_IGN
        ::raise(SIGBUS);
        ::_exit(5);
      },
      ::testing::ExitedWithCode(5), "");
}

TEST_F(MappedFileFault, past_the_tables_slots_a_truncated_file_is_still_reported_without_its_name) {
  TempDir dir;
  const int64_t n = 1 << 18;
  const std::string path = write_tensor_file(dir, n);
  EXPECT_EXIT(
      {
        // Every slot taken by a 1-byte range of this array (no fault happens there).
        static char filler[4096];
        for (int i = 0; i < 4096; ++i) watch_mapping(filler + i, 1, "filler", "none");
        SafetensorsReader f(path);
        if (::truncate(path.c_str(), 4096) != 0) ::_exit(3);
        volatile float last = static_cast<const volatile float*>(f.data("w"))[n - 1];
        (void)last;
        ::_exit(4);
      },
      ::testing::ExitedWithCode(1),
      "^error: a memory-mapped file could not be read \\(SIGBUS\\): a token, checkpoint or weights file was "
      "probably truncated or replaced while moetrain read it; restore it and run again\n$");
}

// Past the table, only faults inside the unnamed mappings' span are a file's: a fault in memory
// moetrain never watched (here a file mapped without watch_mapping, as MPI's shared memory is)
// keeps the default action instead of being reported as a truncated file.
TEST_F(MappedFileFault, past_the_tables_slots_a_fault_in_unwatched_memory_keeps_the_default_action) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer the previous SIGBUS action is its own report, not the default";
#endif
  TempDir dir;
  const int64_t n = 1 << 18;
  const std::string path = write_tensor_file(dir, n);
  const std::string other = dir / "other.bin";
  std::filesystem::copy_file(path, other);
  EXPECT_EXIT(
      {
        static char filler[4096];
        for (int i = 0; i < 4096; ++i) watch_mapping(filler + i, 1, "filler", "none");
        SafetensorsReader f(path);  // unnamed, but watched
        const int fd = ::open(other.c_str(), O_RDONLY);
        void* m = ::mmap(nullptr, static_cast<size_t>(n) * 4 + 4096, PROT_READ, MAP_PRIVATE, fd, 0);
        if (fd < 0 || m == MAP_FAILED || ::truncate(other.c_str(), 4096) != 0) ::_exit(3);
        volatile char last = static_cast<const volatile char*>(m)[static_cast<size_t>(n) * 4];
        (void)last;
        ::_exit(4);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST_F(MappedFileFault, a_closed_files_slot_is_not_named_for_a_later_mapping) {
  TempDir dir;
  const std::string first = write_tensor_file(dir, 1 << 18);
  const std::string second = write_tensor_file(dir, 1 << 18, "second.safetensors");
  EXPECT_EXIT(
      {
        { SafetensorsReader closed(first); }
        SafetensorsReader f(second);
        if (::truncate(second.c_str(), 4096) != 0) ::_exit(3);
        volatile float last = static_cast<const volatile float*>(f.data("w"))[(1 << 18) - 1];
        (void)last;
        ::_exit(4);
      },
      ::testing::ExitedWithCode(1), "^error: " + second + " could not be read \\(SIGBUS\\)");
}

}  // namespace
}  // namespace moe
