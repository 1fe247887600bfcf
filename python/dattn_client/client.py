"""dattn's Python client: attention on numpy arrays (JobService.Attend), jobs and their events.

Thread-safety: a Client may be used from several threads at once (its gRPC channel is); each call
is independent. Errors: every failed call raises a DattnError subclass (errors.py); bad arguments
raise ValueError naming the argument before anything is sent.
"""

import dataclasses
import os
import uuid

import grpc
import numpy as np
from google.protobuf import json_format

from dattn.v1 import attention_pb2, job_pb2, job_service_pb2, job_service_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from . import errors

# Largest data chunk of a tensor stream (api/limits.h kMaxOutputChunkBytes).
CHUNK_BYTES = 4 << 20
# Largest gRPC message the coordinator exchanges (api/limits.h kMaxMessageBytes).
_MAX_MESSAGE_BYTES = 32 << 20

_NUMPY_DTYPES = {
    np.dtype("<f8"): attention_pb2.DTYPE_FP64,
    np.dtype("<f4"): attention_pb2.DTYPE_FP32,
    np.dtype("<f2"): attention_pb2.DTYPE_FP16,
}
_NAMED_DTYPES = {
    "fp64": attention_pb2.DTYPE_FP64,
    "fp32": attention_pb2.DTYPE_FP32,
    "fp16": attention_pb2.DTYPE_FP16,
    "bf16": attention_pb2.DTYPE_BF16,
}
# How each wire dtype is held in numpy (bf16 as its raw 16-bit patterns: numpy has no bfloat16).
_HELD_AS = {
    attention_pb2.DTYPE_FP64: np.dtype("<f8"),
    attention_pb2.DTYPE_FP32: np.dtype("<f4"),
    attention_pb2.DTYPE_FP16: np.dtype("<f2"),
    attention_pb2.DTYPE_BF16: np.dtype("<u2"),
}
_MODES = {"grouped": attention_pb2.ATTENTION_MODE_GROUPED,
          "mixture": attention_pb2.ATTENTION_MODE_MIXTURE}
_HEAD_OFFSETS = {"modulo": attention_pb2.HEAD_OFFSETS_MODULO,
                 "blocked": attention_pb2.HEAD_OFFSETS_BLOCKED}
_DEVICES = {"any": job_pb2.DEVICE_PREFERENCE_ANY, "cpu": job_pb2.DEVICE_PREFERENCE_CPU,
            "gpu": job_pb2.DEVICE_PREFERENCE_GPU}
_TERMINAL = {job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED}


@dataclasses.dataclass
class AttendInfo:
    """What the last Attend call of a Client ran: its job, its ring and the job's result (an
    AttentionJobResult: per-rank step times, TFLOP/s, checksums)."""
    job_id: str
    num_ranks: int
    result: object


class Client:
    """A connection to a dattn coordinator, set up by the CLI's rules (docs/CLI.md, "Connecting";
    client/connection.cc).

    address: HOST:PORT or any gRPC target (default $DATTN_COORDINATOR, else 127.0.0.1:7070).
    ca: the cluster CA's PEM file (default $DATTN_TLS_CA); with one the channel is TLS, without it
    plaintext (a coordinator started --insecure). token: the bearer token (default: the first line
    of token_file, else $DATTN_TOKEN; surrounding whitespace is dropped), sent as
    "authorization: Bearer TOKEN" on every call. A token is never sent in plaintext: a token
    without a CA raises ValueError unless insecure=True says plaintext is meant (insecure=True
    also ignores ca and $DATTN_TLS_CA, as the CLI's --insecure does). server_name: the name to
    check the coordinator's certificate against (default: the address's host). timeout: the
    deadline, in seconds, of each unary call (Attend and watch calls take their own `timeout`,
    none by default).
    """

    def __init__(self, address=None, *, ca=None, token=None, token_file=None, insecure=False,
                 server_name=None, timeout=30.0):
        self.address = address or os.environ.get("DATTN_COORDINATOR") or "127.0.0.1:7070"
        if insecure:
            ca = ""
        elif ca is None:
            ca = os.environ.get("DATTN_TLS_CA", "")
        if token is None and token_file:
            try:
                with open(token_file, encoding="utf-8") as f:
                    token = f.readline().strip()
            except OSError as e:
                raise ValueError(f"token_file {token_file}: cannot be read ({e})") from None
            if not token:
                raise ValueError(f"token_file {token_file}: its first line holds no token")
        if token is None:
            token = os.environ.get("DATTN_TOKEN", "")
        token = token.strip()
        if token and not ca and not insecure:
            raise ValueError("token: a bearer token goes only over TLS: give ca (or $DATTN_TLS_CA) "
                             "with the cluster CA, or insecure=True for a coordinator without TLS")
        self.timeout = timeout
        self.tls = bool(ca)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        # As the CLI: messages up to api::kMaxMessageBytes; keepalive pings every 330 s (servers
        # refuse them more often than every 5 minutes) notice a connection that died without a
        # reset while a watch or an Attend call waits.
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                   ("grpc.keepalive_time_ms", 330 * 1000),
                   ("grpc.keepalive_timeout_ms", 20 * 1000),
                   ("grpc.http2.max_pings_without_data", 0)]
        if ca:
            try:
                with open(ca, "rb") as f:
                    root = f.read()
            except OSError as e:
                raise ValueError(f"ca {ca}: cannot be read ({e})") from None
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            credentials = grpc.ssl_channel_credentials(root_certificates=root)
            self._channel = grpc.secure_channel(self.address, credentials, options)
        else:
            self._channel = grpc.insecure_channel(self.address, options)
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self.last_attend = None  # AttendInfo of the last Attend call that was accepted.

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- Attention on your own tensors --------------------------------------------------------

    def attend(self, q, k, v, segment_lengths, dilation_rates, **options):
        """Dilated attention of (B, N, H, D) arrays q, k, v; returns out, an array like q.

        Options: causal (False), mode ("grouped" or "mixture"), scale (1/sqrt(D)), head_offsets
        ("modulo" or "blocked", mixture only), num_ranks (0: the fewest ranks that fit), device
        ("any", "cpu", "gpu"), dtype (None: q's; "bf16" for uint16 arrays holding bfloat16 bit
        patterns, as numpy has no bfloat16), name, priority, timeout (seconds for the whole call).
        """
        return self._attend([q, k, v], segment_lengths, dilation_rates, **options)[0]

    def attend_backward(self, q, k, v, dout, segment_lengths, dilation_rates, **options):
        """Forward and backward: returns (out, dq, dk, dv), the gradients of sum(out * dout).
        Options as attend()."""
        return tuple(self._attend([q, k, v, dout], segment_lengths, dilation_rates, **options))

    def _attend(self, tensors, segment_lengths, dilation_rates, *, causal=False, mode="grouped",
                scale=None, head_offsets=None, num_ranks=0, device="any", dtype=None, name="",
                priority=0, timeout=None):
        names = ["q", "k", "v", "dout"]
        arrays = []
        for i, t in enumerate(tensors):
            a = np.asarray(t)
            if a.ndim != 4:
                raise ValueError(f"{names[i]}: a (B, N, H, D) array, got {a.ndim} dimensions")
            if i > 0 and a.shape != arrays[0].shape:
                raise ValueError(f"{names[i]}: shape {a.shape} differs from q's {arrays[0].shape}")
            arrays.append(a)
        if dtype is None:
            wire = _NUMPY_DTYPES.get(arrays[0].dtype.newbyteorder("<"))
            if wire is None:
                raise ValueError(f"q: dtype {arrays[0].dtype} is not float64, float32 or float16 "
                                 "(give dtype='bf16' for uint16 arrays of bfloat16 bits)")
        elif dtype in _NAMED_DTYPES:
            wire = _NAMED_DTYPES[dtype]
        else:
            raise ValueError(f"dtype: {dtype!r} is not one of {sorted(_NAMED_DTYPES)}")
        held = _HELD_AS[wire]
        for i, a in enumerate(arrays):
            if a.dtype.newbyteorder("<") != held:
                raise ValueError(f"{names[i]}: dtype {a.dtype}; this call's tensors are {held} "
                                 f"({dtype or 'q'}'s), all of them")
        arrays = [np.ascontiguousarray(a, dtype=held) for a in arrays]
        if len(segment_lengths) != len(dilation_rates) or not segment_lengths:
            raise ValueError("segment_lengths and dilation_rates: one rate per segment length, "
                             f"got {len(segment_lengths)} and {len(dilation_rates)}")
        if mode not in _MODES:
            raise ValueError(f"mode: {mode!r} is not one of {sorted(_MODES)}")
        if head_offsets is not None and head_offsets not in _HEAD_OFFSETS:
            raise ValueError(f"head_offsets: {head_offsets!r} is not one of {sorted(_HEAD_OFFSETS)}")
        if device not in _DEVICES:
            raise ValueError(f"device: {device!r} is not one of {sorted(_DEVICES)}")

        start = job_service_pb2.AttendStart(
            dtype=wire, num_ranks=num_ranks, backward=len(arrays) == 4, device=_DEVICES[device],
            name=name, priority=priority)
        start.attention.segment_lengths.extend(int(w) for w in segment_lengths)
        start.attention.dilation_rates.extend(int(r) for r in dilation_rates)
        start.attention.causal = bool(causal)
        start.attention.mode = _MODES[mode]
        if scale is not None:
            start.attention.scale = float(scale)
        if head_offsets is not None:
            start.attention.head_offsets = _HEAD_OFFSETS[head_offsets]
        b, n, h, d = arrays[0].shape
        start.shape.batch, start.shape.seq_len, start.shape.num_heads, start.shape.head_dim = (
            b, n, h, d)

        def requests():
            yield job_service_pb2.AttendRequest(start=start)
            for i, a in enumerate(arrays):
                data = memoryview(a.reshape(-1)).cast("B")
                for offset in range(0, len(data), CHUNK_BYTES):
                    yield job_service_pb2.AttendRequest(chunk=attention_pb2.AttendChunk(
                        tensor=attention_pb2.ATTEND_TENSOR_Q + i, offset=offset,
                        data=bytes(data[offset:offset + CHUNK_BYTES])))

        outputs = [np.empty(arrays[0].shape, dtype=held) for _ in range(len(arrays) // 4 * 3 + 1)]
        views = [o.reshape(-1).view(np.uint8) for o in outputs]
        filled = [0] * len(outputs)
        info = None
        done = None
        try:
            for response in self._jobs.Attend(requests(), metadata=self._metadata,
                                              timeout=timeout):
                which = response.WhichOneof("message")
                if which == "accepted":
                    info = AttendInfo(response.accepted.job_id, response.accepted.num_ranks, None)
                    self.last_attend = info
                elif which == "chunk":
                    c = response.chunk
                    t = c.tensor - attention_pb2.ATTEND_TENSOR_OUT
                    if not 0 <= t < len(outputs) or c.offset != filled[t] or \
                            c.offset + len(c.data) > views[t].size:
                        raise errors.ProtocolError(
                            f"an output chunk of tensor {c.tensor} at byte {c.offset} with "
                            f"{len(c.data)} bytes (expected output {t} at byte "
                            f"{filled[t] if 0 <= t < len(outputs) else '-'})")
                    views[t][c.offset:c.offset + len(c.data)] = np.frombuffer(c.data, np.uint8)
                    filled[t] += len(c.data)
                elif which == "done":
                    done = response.done
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, "attend") from None
        if done is None or any(f != v.size for f, v in zip(filled, views)):
            raise errors.ProtocolError(
                f"the call ended without its whole result ({filled} of {views[0].size} bytes "
                "each)")
        if info is not None:
            info.result = done
        return outputs

    # ---- Jobs ----------------------------------------------------------------------------------

    def _call(self, method, request, what):
        try:
            return method(request, metadata=self._metadata, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, what) from None

    def submit(self, spec, idempotency_key=None):
        """Submits a job: `spec` is a JobSpec or a dict in its JSON form (e.g. {"attention": {...}}
        or {"training": {"config_json": ...}}). Returns the Job. A retry with the same key and spec
        returns the same job."""
        if isinstance(spec, dict):
            spec = json_format.ParseDict(spec, job_pb2.JobSpec())
        request = job_service_pb2.SubmitJobRequest(
            idempotency_key=idempotency_key or str(uuid.uuid4()), spec=spec)
        return self._call(self._jobs.SubmitJob, request, "submit").job

    def submit_training(self, config, *, data_parallel=1, sequence_parallel=1, device="any",
                        checkpoint_dir="", init_from="", name="", idempotency_key=None):
        """A training job of trainer config `config` (a dict, as dattn-train --config takes it;
        docs/TRAINING.md); data_parallel="auto" lets the coordinator pick D."""
        import json
        training = job_pb2.TrainingJobSpec(
            config_json=json.dumps(config), sequence_parallel=sequence_parallel,
            device=_DEVICES[device], checkpoint_dir=checkpoint_dir, init_from=init_from)
        if data_parallel == "auto":
            training.auto_data_parallel = True
        else:
            training.data_parallel = data_parallel
        return self.submit(job_pb2.JobSpec(name=name, training=training), idempotency_key)

    def get_job(self, job_id, events=False):
        return self._call(self._jobs.GetJob,
                          job_service_pb2.GetJobRequest(job_id=job_id, include_events=events),
                          f"get job {job_id}")

    def cancel(self, job_id, reason=""):
        return self._call(self._jobs.CancelJob,
                          job_service_pb2.CancelJobRequest(job_id=job_id, reason=reason),
                          f"cancel job {job_id}")

    def delete(self, job_id):
        return self._call(self._jobs.DeleteJob, job_service_pb2.DeleteJobRequest(job_id=job_id),
                          f"delete job {job_id}")

    def list_jobs(self, states=(), tenant="", kind="", limit=None):
        """Jobs, newest first, every page (at most `limit`). states: JobState values."""
        jobs, token = [], ""
        while True:
            page = self._call(self._jobs.ListJobs, job_service_pb2.ListJobsRequest(
                states=list(states), tenant=tenant, kind=kind, page_size=1000, page_token=token),
                "list jobs")
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token or (limit is not None and len(jobs) >= limit):
                return jobs[:limit] if limit is not None else jobs

    def watch(self, job_id, after_seq=0, timeout=None):
        """The job's events with seq > after_seq, then live ones until it ends (an iterator)."""
        try:
            for event in self._jobs.WatchJob(
                    job_service_pb2.WatchJobRequest(job_id=job_id, after_seq=after_seq),
                    metadata=self._metadata, timeout=timeout):
                yield event
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"watch job {job_id}") from None

    def wait(self, job_id, timeout=None):
        """Follows the job's events until it ends; returns the final Job."""
        for _ in self.watch(job_id, timeout=timeout):
            pass
        return self.get_job(job_id)

    def read_output(self, job_id):
        """A succeeded job's kept output (submitted with return_output) as a numpy array (bf16 as
        uint16 bit patterns)."""
        out, view, filled = None, None, 0
        try:
            for chunk in self._jobs.ReadOutput(job_service_pb2.ReadOutputRequest(job_id=job_id),
                                               metadata=self._metadata, timeout=self.timeout):
                if chunk.HasField("header"):
                    out = np.empty(tuple(chunk.header.shape), dtype=_HELD_AS[chunk.header.dtype])
                    view = out.reshape(-1).view(np.uint8)
                if view is None or chunk.offset != filled or \
                        chunk.offset + len(chunk.data) > view.size:
                    raise errors.ProtocolError(f"output chunk at byte {chunk.offset} out of order")
                view[filled:filled + len(chunk.data)] = np.frombuffer(chunk.data, np.uint8)
                filled += len(chunk.data)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"read output of {job_id}") from None
        if view is None or filled != view.size:
            raise errors.ProtocolError(f"the output of {job_id} ended at byte {filled}")
        return out

    # ---- Health --------------------------------------------------------------------------------

    def health(self, service=""):
        """The coordinator's grpc.health.v1 status of `service` ("" is the server as a whole;
        "dattn.v1.JobService" the job API): "SERVING", "NOT_SERVING" or "UNKNOWN". A service the
        coordinator does not have raises NotFound, an unreachable one Unavailable."""
        response = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service),
                              f"health of {service or 'the server'}")
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def is_terminal(state):
    """Whether a JobState is SUCCEEDED, FAILED or CANCELLED."""
    return state in _TERMINAL
