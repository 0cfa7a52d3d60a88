"""Errors Sluice raises on bad input.  Each says what was wrong and what to do."""


class SluiceError(Exception):
    """Base class for Sluice's own errors."""


class InvalidQueueName(SluiceError, ValueError):
    pass


class UnknownQueue(SluiceError, LookupError):
    pass


class InvalidTTL(SluiceError, ValueError):
    pass


class InvalidHeaders(SluiceError, ValueError):
    pass


class BodyTooLarge(SluiceError, ValueError):
    pass


class InvalidMessage(SluiceError, ValueError):
    pass


class PoisonMessage(SluiceError):
    """A queue row Sluice cannot parse; it goes to the error queue as it is."""


class NoHandler(SluiceError):
    """No handler is registered for a message's type on its queue."""


class ConfigurationError(SluiceError):
    pass


class Unavailable(SluiceError):
    """A part of Sluice pauses after failing, as its circuit breaker asks (the delayed store):
    the same call may succeed later.  Never a message's fault: a failed message whose
    outcome cannot be recorded for this reason is received again, not set aside as poison
    (core.receive.last_resort)."""
