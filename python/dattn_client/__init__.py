"""dattn's Python client (docs/PYTHON.md).

    from dattn_client import Client
    with Client("127.0.0.1:7070") as c:
        out = c.attend(q, k, v, segment_lengths=[2048, 4096], dilation_rates=[1, 2], causal=True)
"""

from .client import CHUNK_BYTES, AttendInfo, Client, is_terminal
from .errors import (AlreadyExists, Cancelled, DattnError, DeadlineExceeded, FailedPrecondition,
                     InvalidArgument, NotFound, PermissionDenied, ProtocolError, ResourceExhausted,
                     Unauthenticated, Unavailable)

__all__ = [
    "AlreadyExists", "AttendInfo", "CHUNK_BYTES", "Cancelled", "Client", "DattnError",
    "DeadlineExceeded", "FailedPrecondition", "InvalidArgument", "NotFound", "PermissionDenied",
    "ProtocolError", "ResourceExhausted", "Unauthenticated", "Unavailable", "is_terminal",
]
