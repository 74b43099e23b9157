"""Other libraries' errors in one line, as every jaxlm error is said."""
import errno

from jaxlm.corpora.text import file_in_the_way


def first_line(err: BaseException) -> str:
    """An error's first line, or its type when it says nothing."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def os_error_line(err: OSError) -> str:
    """An OSError in one line: where the operating system's own message (`[Errno 17] File exists: 'x'`) comes from
    a file standing where the command needs a directory, that file named; any other error as it is."""
    if not str(err).startswith("[Errno") or not err.filename or err.errno not in (errno.EEXIST, errno.ENOTDIR):
        return str(err)
    blocked = file_in_the_way(err.filename)
    if blocked is None:
        return str(err)
    return f"{blocked} is a file where a directory is needed; move it or choose another path"
