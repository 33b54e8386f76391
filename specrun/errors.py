"""The one exception type the CLI turns into a single line and a non-zero exit."""


class SpecrunError(Exception):
    """A problem the user can fix; the message says what and how."""

    exit_code = 2


class IncompatibleError(SpecrunError):
    """A draft that cannot draft for the target, even translated: their vocabularies share almost nothing."""


class RpcLost(SpecrunError):
    """An RPC server went away (or the link to it was given up): the layers it held are gone,
    and llama.cpp's RPC client cannot carry on in this process."""

    exit_code = 1


class RpcTimeout(RpcLost):
    """RPC servers did not answer a call within its timeout (--rpc-timeout for decodes)."""
