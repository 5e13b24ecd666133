// The lock of a run directory (<run>/.lock): held by the job's rank 0 for the whole run, so two
// jobs never write one directory. The kernel's flock on the open file is the lock (it ends with
// the process, however it ends); the file's content (pid, host, start time) only tells the next
// job who held it. A lock whose holder has gone is reported and taken over; a held lock, and a
// lock file whose content is not what moetrain writes, are errors naming the file.
#pragma once

#include <chrono>
#include <string>

namespace moe {

// How long a job's start asks again for a lock someone holds before it says the directory is in
// use: far longer than a probe holds its shared lock, short beside a job's start.
inline constexpr std::chrono::milliseconds kBusyFor{500};

class RunLock {
 public:
  // Takes the lock or throws naming the holder.
  explicit RunLock(std::string path);
  ~RunLock();  // removes the file, then releases the lock
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// Who holds the lock at `path` now ("process 123 on host h since ...", or "another job" when its
// content is not moetrain's), or "" when nobody does or there is no lock file. It holds a shared
// lock for an instant to find out; a job about to read the run directory (a resume) asks first, so
// a live run is named as such.
std::string run_lock_holder(const std::string& path);

}  // namespace moe
