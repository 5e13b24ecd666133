// The lock that keeps `moetrain prepare` calls (and python/tokenize_hf.py runs, which lock alike)
// into one output folder apart: two --append runs would each rewrite dataset.json from what they
// read, and one's files would end up unlisted; a call into a folder another is still creating
// would take that one's temporary files for an interrupted prepare's. Used by data/prepare.cpp only.
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

// For readers of a token folder: when a prepare or tokenize_hf.py holds `folder`'s lock (it is
// adding files: their .npy files are renamed in before the dataset.json that lists them), waits
// until it lets go, saying so once on stderr, and returns true; returns false at once when none
// holds it or the file system cannot lock folders.
bool wait_for_folder_writer(const std::filesystem::path& folder);

}  // namespace moe
