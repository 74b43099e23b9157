"""The `jaxlm` program: its process started with huge pages for XLA's host memory, then the command line."""
import sys

from jaxlm import host_memory


def main() -> None:
    host_memory.restart_with_huge_pages()  # first: the restart would otherwise import jax twice (4 s)
    from jaxlm import cli  # after the restart
    sys.exit(cli.main())
