"""The one error of the test clusters."""


class Unavailable(RuntimeError):
    """This machine cannot provide the cluster asked for; the message says why."""
