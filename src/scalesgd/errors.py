"""Errors that end a run with one clear line instead of a traceback."""


class UsageError(ValueError):
    """Bad input from the user: reported as one line, exit status 2, nothing written over."""


class NonFiniteLoss(RuntimeError):
    """The loss became inf/NaN: the run stops and the last good checkpoint is kept."""


class PeerLost(RuntimeError):
    """A collective failed because another worker died or stopped answering within the timeout."""


EXIT_USAGE = 2
EXIT_PEER_LOST = 3
EXIT_NON_FINITE = 4
