"""The one exception hierarchy of the client: every gRPC error becomes a DattnError subclass."""

import grpc


class DattnError(Exception):
    """A call failed. `code` is the grpc.StatusCode, `details` the coordinator's message (it names
    the bad field or tensor and the value)."""

    def __init__(self, code, details, what=""):
        self.code = code
        self.details = details
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}{code.name}: {details}")


class InvalidArgument(DattnError):
    """A bad spec, call or tensor; the message names it."""


class NotFound(DattnError):
    """No such job (or another tenant's)."""


class AlreadyExists(DattnError):
    """An idempotency key reused with another spec."""


class ResourceExhausted(DattnError):
    """The work fits no ready worker, or a quota is full; the message has the numbers."""


class FailedPrecondition(DattnError):
    """Not now: e.g. no worker ready to size a call, a job not finished."""


class Unavailable(DattnError):
    """The coordinator cannot be reached or is not ready; safe to retry."""


class PermissionDenied(DattnError):
    """The token's role or tenant does not allow it."""


class Unauthenticated(DattnError):
    """No token, or a token the coordinator does not know."""


class DeadlineExceeded(DattnError):
    """The call's deadline passed."""


class Cancelled(DattnError):
    """The call (or its job) was cancelled."""


class ProtocolError(DattnError):
    """The coordinator's answer broke the protocol (a chunk out of order, a missing result)."""

    def __init__(self, details):
        super().__init__(grpc.StatusCode.INTERNAL, details)


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def from_rpc_error(error, what=""):
    """The DattnError for a grpc.RpcError (the one conversion)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return _BY_CODE.get(code, DattnError)(code, details or "", what)
