"""Files opened as files, not as names: a FIFO, socket or device never hangs a read, and a link never
redirects a write.

Two kinds of path: a file someone hands in (a checkpoint, a config, a list file, a result to merge)
may be reached through a symbolic link, but must be a plain file; a file the project keeps for
itself (its work dir's ``last_checkpoint``, lock and pseudo labels, the zoo's cache) must be its own
name: no symbolic link, and where it is written in place, no second name (a hard link) whose file
the write would change too. A folder the project makes and writes in (a run's log folder) is the
same: a folder of its own name, holding such files. Anything else is refused in one line naming
what the path is, before anything is written.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import IO

# How each file type reads in an error message.
_KINDS = ((stat.S_ISDIR, 'a folder'), (stat.S_ISFIFO, 'a FIFO (named pipe)'), (stat.S_ISSOCK, 'a socket'),
          (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'),
          (stat.S_ISLNK, 'a symbolic link'), (stat.S_ISREG, 'a file'))
# open() modes -> os.open flags; a truncating write truncates only once the file is checked.
_FLAGS = {'r': os.O_RDONLY, 'w': os.O_WRONLY | os.O_CREAT, 'a': os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          'r+': os.O_RDWR, 'w+': os.O_RDWR | os.O_CREAT, 'a+': os.O_RDWR | os.O_CREAT | os.O_APPEND}


class NotAPlainFile(OSError):
    """A path that names something other than the plain file expected (its message says what)."""

    def __str__(self) -> str:
        return self.strerror


def kind_of(mode: int) -> str:
    """What a file mode (``st_mode``) is, as an error message names it."""
    return next((name for test, name in _KINDS if test(mode)), 'not a plain file')


# The fix for something in the way of what the project makes for itself.
_OWN_FILE_FIX = 'delete it (the project writes it as a plain file of its own) and run again'
_OWN_FOLDER_FIX = 'delete it (the project makes it as a folder of its own) and run again'


def _refusal(path: str, kind: str, expected: str, fix: str) -> NotAPlainFile:
    """The one-line error for ``kind`` (as :func:`kind_of` names it) at ``path`` where ``expected``
    (``'the plain config file'``) should be, with ``fix``."""
    error = NotAPlainFile(errno.EINVAL, f'{path} is {kind}, not {expected} expected; {fix}')
    error.filename = path
    return error


def _file_refusal(path: str, what: str, kind: str, own: bool, fix: str | None = None) -> NotAPlainFile:
    fix = fix or (_OWN_FILE_FIX if own else f'pass the {what} itself')
    return _refusal(path, kind, f'the plain {what}', fix)


def _check_stat(st: os.stat_result, path: str, what: str, own: bool, writing: bool,
                fix: str | None = None) -> None:
    if own and stat.S_ISLNK(st.st_mode):
        raise _file_refusal(path, what, 'a symbolic link', own, fix)
    if not stat.S_ISREG(st.st_mode):
        raise _file_refusal(path, what, kind_of(st.st_mode), own, fix)
    if own and writing and st.st_nlink > 1:
        raise _file_refusal(path, what, f'a hard link (one of {st.st_nlink} names of one file, which a '
                                   'write here would change under every name)', own, fix)


def check_plain_file(path: str, what: str = 'file', own: bool = False, writing: bool = False) -> os.stat_result:
    """The ``stat`` of ``path`` once it is a plain file (see the module's docstring), else
    :class:`NotAPlainFile`; ``FileNotFoundError`` where nothing is there."""
    st = os.lstat(path) if own else os.stat(path)
    _check_stat(st, path, what, own, writing)
    return st


def check_open_file(fd: int, path: str, what: str = 'file', own: bool = False, writing: bool = False) -> None:
    """Refuse the file open as ``fd`` (opened with ``O_NONBLOCK``, and ``O_NOFOLLOW`` where ``own``) unless
    it is a plain file (:class:`NotAPlainFile`), then let it block as usual."""
    _check_stat(os.fstat(fd), path, what, own, writing)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)


def open_plain(path: str, mode: str = 'rb', what: str = 'file', own: bool = False,
               encoding: str | None = None) -> IO:
    """``path`` opened like ``open(path, mode)``, once the open file is a plain file (see the module's
    docstring: ``own`` for the project's own files); never blocks on a FIFO or device."""
    base = mode.replace('b', '').replace('t', '')
    writing = base != 'r'
    flags = _FLAGS[base] | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if own else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP and own:  # O_NOFOLLOW met a symbolic link
            raise _file_refusal(path, what, 'a symbolic link', own) from None
        if err.errno in (errno.ENXIO, errno.EISDIR):  # a socket, a FIFO without a reader, a folder
            raise _file_refusal(path, what, kind_of(os.stat(path).st_mode), own) from None
        raise
    try:
        check_open_file(fd, path, what, own, writing)
        if base.startswith('w'):
            os.ftruncate(fd, 0)
        return os.fdopen(fd, mode, encoding=encoding) if 'b' not in mode else os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def check_replaceable(path: str) -> None:
    """Refuse a folder, FIFO, socket or device at ``path``, which a file written whole (a temp file
    renamed over it) would fail on or destroy; a link there is replaced, never written through."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # nothing there (or its folder is missing): nothing in the way
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise _refusal(path, kind_of(mode), 'the plain file', _OWN_FILE_FIX)


def check_own_path(path: str, what: str, folder: bool = False, fix: str | None = None) -> bool:
    """Whether something is at ``path``, once it may be written as the project's own ``what``: a plain
    file of one name, or with ``folder`` a folder (never a link, FIFO, socket or device); else
    :class:`NotAPlainFile` naming it and ``fix``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not folder:
        _check_stat(st, path, what, own=True, writing=True, fix=fix)
    elif not stat.S_ISDIR(st.st_mode):
        raise _refusal(path, kind_of(st.st_mode), f'the {what}', fix or _OWN_FOLDER_FIX)
    return True


def check_own_tree(path: str, what: str, folders: tuple[str, ...] = ()) -> None:
    """Refuse the folder ``path`` that the project makes and writes ``what`` files in, unless it is
    missing, or is this user's folder holding only plain files of one name and, at the relative paths
    ``folders``, folders alike (:class:`NotAPlainFile` naming the first entry that is not)."""
    if not check_own_path(path, f'{what} folder', folder=True):
        return
    owner = os.lstat(path).st_uid
    if owner != os.geteuid():  # its owner could put a link in it at any time
        raise _refusal(path, f'a folder of another user (uid {owner})', f'the {what} folder', _OWN_FOLDER_FIX)
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            inner = tuple(f[len(entry.name) + 1:] for f in folders if f.startswith(entry.name + '/'))
            if entry.name in folders:
                check_own_tree(entry.path, what, inner)
            else:
                check_own_path(entry.path, f'{what} file')
