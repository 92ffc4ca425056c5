"""SIGTERM as an exception: `Terminated` is raised where Ctrl-C raises KeyboardInterrupt, so that one path stops a
command on either (`cli.main` maps it to status 143, Ctrl-C to 130). Its own module so that command modules
below the command line (`scaleout/command.py`) install the handler without importing `cli`."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so that one path stops a command on either."""


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: raise `Terminated` in the main thread."""
    raise Terminated()
