"""Typed errors a user can hit; each message says what went wrong and what to do next."""


class GeryonError(Exception):
    """Base of every error geryon raises on purpose."""


class ConfigError(GeryonError, ValueError):
    """Bad user input: a rate, a class spec, a name, an option."""


class RateError(ConfigError):
    """A bandwidth string that cannot be parsed."""


class ClassSpecError(ConfigError):
    """An invalid list of priority classes (count, DSCP range, duplicates)."""


class NetconfError(GeryonError):
    """Programming queues on an interface failed."""


class InterfaceNotFound(NetconfError):
    """The named interface does not exist (in the given namespace)."""


class EmulationError(GeryonError):
    """Building, using or removing an emulated cluster failed."""


class NameInUse(EmulationError):
    """An emulated cluster with this name already exists."""


class PermissionNeeded(GeryonError):
    """The operation needs root (CAP_NET_ADMIN)."""
