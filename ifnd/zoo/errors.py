"""The zoo's errors: what a source, a checksum or the cache refuses, and their messages."""


class PermanentError(OSError):
    """A source's answer that a retry would repeat (no such file, a web page, too big)."""


class ChecksumError(RuntimeError):
    """A downloaded file whose checksum differs from the index or from the first download's."""


class UnverifiedError(RuntimeError):
    """An entry whose authors publish no checksum, asked for without ``trust=True``."""


class OversizeError(PermanentError):
    """A download that sends more bytes than the index allows for its entry."""


class WebPageError(PermanentError):
    """A URL that serves a web page (HTML) instead of the checkpoint; retrying does not help."""


class SizeError(PermanentError):
    """A source that sent a whole file of another size than the index's ``size``."""


class SourceNotFoundError(PermanentError):
    """A source that answers that the file, its repository or its commit does not exist."""


class CacheLinkError(RuntimeError):
    """A path in the zoo's cache that is a link leading out of it: nothing is written through it."""


def looks_like_html(head: bytes) -> bool:
    """Whether the first bytes of a file are those of a web page (HTML or XML)."""
    start = head.lstrip()[:256].lower()
    return start.startswith((b'<!doctype html', b'<html', b'<head', b'<body', b'<?xml'))


def web_page_error(source: str, why: str) -> WebPageError:
    """The error of a source that serves a web page instead of the checkpoint."""
    return WebPageError(f'{source} serves a web page ({why}), not the checkpoint: a download page, '
                        'login or error page; use the direct link to the file')


def oversize_error(name: str, source: str, limit: int, received: int, announced: bool = False
                    ) -> OversizeError:
    """The error of a body over the index's size bound, announced or received."""
    what = f'announces {received} bytes' if announced else f'sent more than {received - 1} bytes'
    return OversizeError(f'{name}: {source} {what}, over the {limit} bytes the index allows for it '
                         '(size or max_size); stopped and deleted the partial file')


def not_found_error(name: str, source: str, what: str, fix: str) -> SourceNotFoundError:
    """The error of a source that answers that the file does not exist, with its fix."""
    return SourceNotFoundError(f'{name}: {source}: {what}; {fix}')
