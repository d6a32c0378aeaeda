"""Writing files safely: atomically, honouring the umask, never over what the user did not offer.

``write_text_atomic`` writes beside the target, fsyncs, then renames, so a failed
run leaves nothing half-written.  ``check_output_file`` / ``check_output_dir``
validate an output path *before* any work starts: an unwritable place, a
directory where a file is wanted, or a read-only file is refused up front.
``check_replaceable_file`` is the one rule of every ``--out`` file: an existing file is replaced
only if tierax wrote it (the caller says how to tell), or with an explicit ``--force``.
"""

from __future__ import annotations

import os
import pathlib
import stat
import tempfile
from collections.abc import Callable

from tierax.errors import TieraxError


def _umask() -> int:
    # os.umask has no read-only form: read it from /proc where we can, else set-and-restore.
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode ``open(..., "w")`` would give a new file: 0o666 less the umask."""
    return 0o666 & ~_umask()


def new_dir_mode() -> int:
    """The mode ``mkdir`` would give a new directory: 0o777 less the umask."""
    return 0o777 & ~_umask()


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _can_create_in(d: pathlib.Path) -> bool:
    # access() says yes to root everywhere (even /proc): create and remove a probe file instead.
    try:
        fd, probe = tempfile.mkstemp(dir=d, prefix=".tierax-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _read_only(p: pathlib.Path) -> bool:
    """No write bit at all (what ``chmod a-w`` leaves; root bypasses access(), so the bits
    decide)."""
    return not stat.S_IMODE(p.stat().st_mode) & 0o222


def _check_parent(path: pathlib.Path, option: str) -> None:
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise TieraxError(
            f"{option} {str(path)!r}: {str(base)!r} is not a directory; choose a path under a "
            f"directory"
        )
    if not _can_create_in(base):
        raise TieraxError(
            f"{option} {str(path)!r}: cannot create files under {str(base)!r} (not writable); "
            "choose a writable location"
        )


def check_output_file(path: str | os.PathLike, option: str = "--out") -> pathlib.Path:
    """Refuse, before any work, an output file that could not be written.

    Raises:
      TieraxError: the path is a directory, an existing read-only file, or under a
        place where files cannot be created.
    """
    p = pathlib.Path(path)
    if p.is_dir():
        raise TieraxError(f"{option} {str(p)!r} is a directory; give a file path")
    if p.exists() and (_read_only(p) or not os.access(p, os.W_OK)):
        raise TieraxError(
            f"{option} {str(p)!r} exists and is read-only; it is not replaced — give another path "
            "or make it writable"
        )
    _check_parent(p, option)
    return p


def check_replaceable_file(
    path: str | os.PathLike,
    option: str = "--out",
    *,
    ours: Callable[[pathlib.Path], bool],
    what: str,
    force: bool = False,
    force_flag: str = "--force",
) -> pathlib.Path:
    """:func:`check_output_file`, and: an existing file is replaced only if ``ours(path)`` says
    tierax wrote it (``what`` names such a file in the message), or with ``force``.

    The one rule for every ``--out`` that writes a file: what the user did not offer is not
    overwritten.

    Raises:
      TieraxError: as :func:`check_output_file`, or the file exists, is not ``what``, and
        ``force`` is off.
    """
    p = check_output_file(path, option)
    if p.exists() and not force:
        try:
            mine = ours(p)
        except (OSError, ValueError):
            mine = False
        if not mine:
            raise TieraxError(
                f"{option} {str(p)!r} exists and is not {what}; it is not replaced — give "
                f"another path, or pass {force_flag} to replace it"
            )
    return p


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_metadata(what: str) -> dict:
    """The text chunks tierax writes into a PNG (matplotlib's ``savefig(metadata=...)``): its
    ``Software`` names tierax and the command, so :func:`is_tierax_png` can tell it later."""
    return {"Software": f"tierax {what}"}


def is_tierax_png(path: pathlib.Path, what: str) -> bool:
    """Whether ``path`` is a PNG that tierax's ``what`` wrote (:func:`png_metadata`)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    return head.startswith(PNG_SIGNATURE) and b"Software\x00tierax " + what.encode() in head


def check_output_dir(
    path: str | os.PathLike, option: str = "--out", *, allow_existing: bool = True
) -> pathlib.Path:
    """Refuse, before any work, an output directory that could not be written.

    ``allow_existing=False``: the directory must not exist or must be empty (used
    where tierax writes a whole directory and would otherwise mix runs).

    Raises:
      TieraxError: the path is a file, an unwritable directory, non-empty when that
        is not allowed, or under a place where directories cannot be created.
    """
    p = pathlib.Path(path)
    if p.exists() and not p.is_dir():
        raise TieraxError(f"{option} {str(p)!r} is a file; give a directory path")
    if p.is_dir():
        if not _can_create_in(p):
            raise TieraxError(f"{option} {str(p)!r} is not writable; choose a writable directory")
        if not allow_existing and any(p.iterdir()):
            raise TieraxError(
                f"{option} {str(p)!r} already exists and is not empty; nothing in it "
                "is deleted or replaced — give a new or empty directory"
            )
        return p
    _check_parent(p, option)
    return p


def write_text_atomic(path: str | os.PathLike, text: str | bytes) -> pathlib.Path:
    """Write ``text`` to ``path`` atomically (temp file beside it, fsync, rename).

    A new file gets the umask's mode; a replaced file keeps its mode.  A read-only
    existing file is not replaced.

    Raises:
      TieraxError: ``path`` exists and is read-only.
    """
    path = pathlib.Path(path)
    if path.exists() and (_read_only(path) or not os.access(path, os.W_OK)):
        raise TieraxError(f"{str(path)!r} exists and is read-only; it is not replaced")
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else new_file_mode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _fsync_dir(d: pathlib.Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_temp_dir(parent: pathlib.Path, name: str) -> pathlib.Path:
    """A temporary directory beside ``parent/name`` with the umask's mode (mkdtemp gives 0700)."""
    parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.tmp-"))
    os.chmod(tmp, new_dir_mode())
    return tmp
