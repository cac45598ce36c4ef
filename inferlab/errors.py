"""One exception family, so the CLI can turn any of them into a clear one-line message."""


class InferlabError(Exception):
    """Base class: the message says what went wrong and what to do."""


class CheckpointError(InferlabError, ValueError):
    """A model folder, config or weight file that inferlab cannot load."""
