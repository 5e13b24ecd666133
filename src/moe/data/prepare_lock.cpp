#include "moe/data/prepare_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "moe/core/error.h"
#include "moe/core/printable.h"

namespace moe {

namespace fs = std::filesystem;

namespace {

fs::path nearest_existing_folder(const fs::path& out) {
  std::error_code ec;
  fs::path p = out;
  while (!fs::is_directory(p, ec) && p != p.parent_path()) p = p.parent_path();
  return p;
}

// Whether flock failed because the file system cannot lock a folder opened read-only: NFS (its
// flock is a byte-range lock, which needs write access: EBADF), Lustre without the flock mount
// option (ENOSYS), others (ENOLCK, EOPNOTSUPP, EINVAL).
bool folder_locks_unsupported(int err) {
  return err == EBADF || err == ENOSYS || err == ENOLCK || err == EOPNOTSUPP || err == EINVAL;
}

// Opens folder `p` and takes an exclusive flock on it, waiting for a holder (said once on stderr).
// Where the file system has no such locks, goes on without one, saying so once: refusing would
// make prepare unusable on shared file systems, where datasets live.
int lock_folder(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MOE_CHECK(fd >= 0, "prepare: cannot open ", printable(p.string()), " to lock it: ", std::strerror(errno));
  // Test hook (tests/cli/prepare_cli_test.cpp): a file system without folder locks.
  const bool unsupported = std::getenv("MOE_TEST_NO_FOLDER_LOCKS") != nullptr;
  if (!unsupported && ::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  if (unsupported || folder_locks_unsupported(errno)) {
    static bool said = false;
    if (!said)
      std::fprintf(stderr,
                   "warning: prepare: the file system of %s cannot lock folders (NFS, or Lustre without the flock "
                   "mount option); this prepare goes on unlocked, so another prepare or tokenize_hf.py writing into "
                   "the same folder at the same time could leave one's files out of dataset.json\n",
                   printable(p.string()).c_str());
    said = true;
    return fd;
  }
  if (errno == EWOULDBLOCK) {
    std::fprintf(stderr, "prepare: waiting for another prepare or tokenize_hf.py writing into %s to finish\n",
                 printable(p.string()).c_str());
    std::fflush(stderr);
  }
  while (::flock(fd, LOCK_EX) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    ::close(fd);
    MOE_FAIL("prepare: cannot lock ", printable(p.string()), ": ", std::strerror(err));
  }
  return fd;
}

// Whether the open folder `fd` is still what path `p` names.
bool still_named(int fd, const fs::path& p) {
  struct stat held {
  }, named{};
  return ::fstat(fd, &held) == 0 && ::stat(p.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
         held.st_ino == named.st_ino;
}

}  // namespace

OutputFolderLock::OutputFolderLock(const fs::path& out) : out_(out) {
  for (;;) {
    const fs::path p = nearest_existing_folder(out_);
    fd_ = lock_folder(p);
    if (still_named(fd_, p) && nearest_existing_folder(out_) == p) return;
    ::close(fd_);  // another call created or removed a folder while this one waited
    fd_ = -1;
  }
}

OutputFolderLock::~OutputFolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFolderLock::move_to_created() {
  // Another call may have locked the new folder in the moment between its creation and here; then
  // this waits for it, and the caller finds what it wrote there.
  const int fd = lock_folder(out_);
  ::close(fd_);
  fd_ = fd;
}

namespace {
std::atomic<bool> folder_wait_notices{true};
}  // namespace

void set_folder_wait_notices(bool on) { folder_wait_notices = on; }

FolderReadLock::FolderReadLock(const fs::path& folder) {
  fd_ = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) return;
  if (::flock(fd_, LOCK_SH | LOCK_NB) == 0) return;
  if (errno == EWOULDBLOCK) {
    if (folder_wait_notices) {
      std::fprintf(stderr, "waiting for a prepare or tokenize_hf.py adding files to %s to finish\n",
                   printable(folder.string()).c_str());
      std::fflush(stderr);
    }
    int rc;
    while ((rc = ::flock(fd_, LOCK_SH)) != 0 && errno == EINTR) {
    }
    if (rc == 0) return;
  }
  ::close(fd_);  // no lock to be had: read unlocked
  fd_ = -1;
}

FolderReadLock::~FolderReadLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace moe
