"""The one exception type the CLI turns into a single line and a non-zero exit."""


class SpecrunError(Exception):
    """A problem the user can fix; the message says what and how."""

    exit_code = 2


class IncompatibleError(SpecrunError):
    """A draft whose vocabulary does not match the target's."""

    exit_code = 1
