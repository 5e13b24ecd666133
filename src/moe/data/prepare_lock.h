// The locks on token folders: the one that keeps `moetrain prepare` calls (and
// python/tokenize_hf.py runs, which lock alike) into one output folder apart (two --append runs
// would each rewrite dataset.json from what they read, and one's files would end up unlisted; a
// call into a folder another is still creating would take that one's temporary files for an
// interrupted prepare's; data/prepare.cpp), and the shared lock readers of a token folder take
// against such a writer (data/token_sources.cpp).
#pragma once

#include <filesystem>

namespace moe {

// An exclusive flock on the output folder or, while it does not exist, on its nearest existing
// ancestor. Waits for the holder, saying so once on stderr.
//
// NOTES: a lock on the nearest existing ancestor alone is not enough: once one call has created
// the folder, a later call would lock the new folder (nearest now) while the first still holds
// the ancestor. So the call that creates the folder locks it (move_to_created) before it lets
// the ancestor go, and every lock is checked once granted: when the locked folder is no longer
// the nearest existing one (created, removed or replaced meanwhile), it is released and the
// nearest is locked instead.
class OutputFolderLock {
 public:
  explicit OutputFolderLock(const std::filesystem::path& out);  // absolute, normalized
  ~OutputFolderLock();
  OutputFolderLock(const OutputFolderLock&) = delete;
  OutputFolderLock& operator=(const OutputFolderLock&) = delete;

  // Called once this call has created the output folder: locks it, then releases the ancestor.
  void move_to_created();

 private:
  const std::filesystem::path out_;
  int fd_ = -1;  // the locked folder, open
};

// A reader's shared flock on a token folder, held while it lists the folder and reads its
// dataset.json: a prepare or tokenize_hf.py adding files holds the folder exclusively while it
// renames its .npy files in and then the dataset.json that lists them, so a reader never sees
// the one without the other. Waits for such a writer, saying so once on stderr. Where the folder
// cannot be opened or its file system cannot lock folders, no lock is held (as prepare goes on).
//
// The wait is said by a process whose folder-wait notices are on (the default): a job's ranks all
// read the same folders, so the trainer leaves them on for one rank per host (rank 0 and each
// host's local rank 0: set_folder_wait_notices), and one line per host, not one per rank, says why
// the job waits (node-local copies of a folder wait apart).
class FolderReadLock {
 public:
  explicit FolderReadLock(const std::filesystem::path& folder);
  ~FolderReadLock();
  FolderReadLock(const FolderReadLock&) = delete;
  FolderReadLock& operator=(const FolderReadLock&) = delete;

 private:
  int fd_ = -1;
};

// Whether this process's FolderReadLocks say on stderr that they wait (on by default).
void set_folder_wait_notices(bool on);

}  // namespace moe
