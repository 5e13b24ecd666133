"""How tokenize_hf.py puts a dataset into its output folder, as `moetrain prepare` does
(src/moe/data/prepare_lock.h, prepare.cpp): one writer at a time per folder, and the finished files
renamed into place without ever replacing one that is there, all or none."""
import errno
import fcntl
import os
import sys

_held_locks = []


def _nearest_existing_folder(path):
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


# flock errors of a file system that cannot lock a folder opened read-only: NFS (EBADF), Lustre
# without the flock mount option (ENOSYS), others.
_LOCKS_UNSUPPORTED = (errno.EBADF, errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)
_said_unlocked = []


def _lock(path):
    """An exclusive flock on folder `path` (an open descriptor); waits for a holder, saying so once.

    Where the file system has no such locks, goes on unlocked, saying so once (as moetrain prepare)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if os.environ.get("MOE_TEST_NO_FOLDER_LOCKS"):  # test hook: a file system without folder locks
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"tokenize_hf.py: waiting for another tokenize_hf.py or moetrain prepare writing into {path} to "
              f"finish", file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
        if e.errno not in _LOCKS_UNSUPPORTED:
            os.close(fd)
            raise
        if not _said_unlocked:
            print(f"warning: tokenize_hf.py: the file system of {path} cannot lock folders (NFS, or Lustre without "
                  f"the flock mount option); this run goes on unlocked, so another tokenize_hf.py or moetrain prepare "
                  f"writing into the same folder at the same time could leave one's files out of dataset.json",
                  file=sys.stderr, flush=True)
            _said_unlocked.append(True)
    return fd


def _still_named(fd, path):
    try:
        held, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def lock_output_folder(out):
    """Creates folder `out` where missing and holds an exclusive flock on it until release_locks().

    Returns the folders it created, outermost first. Two --append runs into one folder would each
    rewrite dataset.json from what they read, and a run into a folder another is still creating would
    take that one's temporary files for a killed run's. While `out` is created its nearest existing
    ancestor is locked, and `out` is locked before the ancestor is released; a lock whose folder is no
    longer the nearest existing one once granted (another writer created or removed a folder
    meanwhile) is taken again."""
    out = os.path.abspath(out)
    while True:
        path = _nearest_existing_folder(out)
        fd = _lock(path)
        if _still_named(fd, path) and _nearest_existing_folder(out) == path:
            break
        os.close(fd)
    missing, folder = [], out
    while folder != path:
        missing.insert(0, folder)
        folder = os.path.dirname(folder)
    created = []
    try:
        for folder in missing:
            os.mkdir(folder)
            created.append(folder)
        if missing:
            ancestor, fd = fd, None
            try:
                fd = _lock(out)  # another writer may have locked it first: then this waits for it
            finally:
                os.close(ancestor)
    except BaseException:  # a failed mkdir, or Ctrl-C while waiting: the folders made here go again
        remove_empty_folders(created)
        if fd is not None:
            os.close(fd)
        raise
    _held_locks.append(fd)
    return created


def release_locks():
    """Releases every lock lock_output_folder took (the end of one run, which another may follow)."""
    while _held_locks:
        os.close(_held_locks.pop())


def remove_empty_folders(created):
    """Removes the folders of `created` (outermost first) that exist and are empty, innermost first."""
    for folder in reversed(created):
        try:
            os.rmdir(folder)
        except OSError:
            pass


def place_outputs(renames, replaceable=()):
    """Renames each (temporary, final) pair in order, never replacing an existing final file except
    those named in `replaceable` (an --append's dataset.json, read before).

    A final that exists raises FileExistsError; then, and on any other failure, the files placed
    so far go back under their temporary names (they are this run's own), so the folder holds all
    of the new files or none. A hard link then an unlink is the no-replace rename (Python has no renameat2); where
    the file system has no hard links, a check then a rename."""
    placed = []
    try:
        for temp, final in renames:
            if final in replaceable:
                os.replace(temp, final)
                placed.append(None)  # not removed again: the old file is gone
                continue
            try:
                os.link(temp, final)
            except FileExistsError:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), final) from None
            except OSError:
                if os.path.lexists(final):
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), final) from None
                os.rename(temp, final)
                placed.append(final)
                continue
            placed.append(final)
            os.unlink(temp)
    except BaseException:
        for (temp, _), final in zip(renames, placed):
            if final is None:
                continue
            if os.path.exists(temp):  # placed by a hard link whose temporary name is still there
                os.remove(final)
            else:
                os.rename(final, temp)
        raise
