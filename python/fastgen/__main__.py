"""python -m fastgen (and the `fastgen` command a pip install puts on PATH): the fastgen CLI."""
import os
import sys


def main() -> None:
    from . import _cli_path

    cli = _cli_path()
    os.execv(cli, [cli] + sys.argv[1:])


if __name__ == "__main__":
    main()
