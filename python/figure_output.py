"""Writing the image of a plotting tool (plot_metrics.py, plot_figure4.py): --out is checked before
any work (a folder, a missing folder, an extension matplotlib cannot write, an existing file
without --overwrite), then written under a temporary name beside it and moved into place, so a
failed write (a full disk) leaves neither a partial image nor a damaged old one."""
import errno
import os
import sys


def check_out(out, overwrite, formats):
    """The image format of --out (its extension); exits, before any work, when it cannot be written."""
    if os.path.isdir(out):
        sys.exit(f"error: --out {out} is a folder; name the image file to write")
    if os.path.lexists(out) and not overwrite:
        sys.exit(f"error: --out {out} exists; nothing is overwritten: pass --overwrite to replace it, or choose "
                 f"another file")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        sys.exit(f"error: --out {out}: its folder {folder} does not exist")
    extension = os.path.splitext(out)[1][1:].lower()
    if extension not in formats:
        which = f"'.{extension}' files" if extension else "a file without an extension (it names the format)"
        sys.exit(f"error: --out {out}: matplotlib cannot write {which}; use one of "
                 f"{', '.join('.' + f for f in sorted(formats))}")
    return extension


def save_figure(fig, out, extension, overwrite):
    """Writes fig under a temporary name beside `out`, then moves it there (a link when not overwriting:
    a file that appeared at `out` meanwhile is not replaced either)."""
    folder, name = os.path.split(os.path.abspath(out))
    temp = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
    try:
        fig.savefig(temp, format=extension, dpi=110)
        if overwrite:
            os.replace(temp, out)
        else:
            try:
                os.link(temp, out)
            except OSError as e:
                if isinstance(e, FileExistsError) or e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV,
                                                                       errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                # A filesystem without hard links (exFAT, SMB, some FUSE mounts): claim the name
                # with an exclusive create, then move the image over the empty claim.
                os.close(os.open(out, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                os.replace(temp, out)
    except FileExistsError:
        sys.exit(f"error: --out {out} appeared while plotting; nothing is overwritten: pass --overwrite to replace "
                 f"it, or choose another file")
    except (OSError, RuntimeError, ValueError) as e:  # also a format whose writer needs what is missing (LaTeX)
        why = " ".join(str(getattr(e, "strerror", None) or e).split())  # one line
        sys.exit(f"error: cannot write --out {out}: {why}")
    finally:
        if os.path.lexists(temp):
            os.remove(temp)
