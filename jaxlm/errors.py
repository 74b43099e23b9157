"""Other libraries' errors in one line, as every jaxlm error is said."""


def first_line(err: BaseException) -> str:
    """An error's first line, or its type when it says nothing."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
