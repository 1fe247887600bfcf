"""dattn's Python client: attention on numpy arrays (JobService.Attend), jobs and their events,
deployments (deploy, generate, score).

Thread-safety: a Client may be used from several threads at once (its gRPC channel is); each call
is independent. Errors: every failed call raises a DattnError subclass (errors.py); bad arguments
raise ValueError naming the argument before anything is sent.
"""

import dataclasses
import os
import time
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


def _check_choices(mode, head_offsets, device):
    """ValueError naming the argument for a mode, head_offsets or device that is not one of the
    names attend() and submit_attention() take."""
    if mode not in _MODES:
        raise ValueError(f"mode: {mode!r} is not one of {sorted(_MODES)}")
    if head_offsets is not None and head_offsets not in _HEAD_OFFSETS:
        raise ValueError(f"head_offsets: {head_offsets!r} is not one of {sorted(_HEAD_OFFSETS)}")
    if device not in _DEVICES:
        raise ValueError(f"device: {device!r} is not one of {sorted(_DEVICES)}")


def _fill_attention(spec, segment_lengths, dilation_rates, causal, mode, scale, head_offsets):
    """Sets an AttentionSpec message from the arguments attend() and submit_attention() take
    (already checked by the caller)."""
    spec.segment_lengths.extend(int(w) for w in segment_lengths)
    spec.dilation_rates.extend(int(r) for r in dilation_rates)
    spec.causal = bool(causal)
    spec.mode = _MODES[mode]
    if scale is not None:
        spec.scale = float(scale)
    if head_offsets is not None:
        spec.head_offsets = _HEAD_OFFSETS[head_offsets]


@dataclasses.dataclass
class AttendInfo:
    """What the last Attend call of a Client ran: its job, its ring and the job's result (an
    AttentionJobResult: per-rank step times, TFLOP/s, checksums)."""
    job_id: str
    num_ranks: int
    result: object


class _SharedRegion:
    """A POSIX shared-memory object holding an Attend call's tensors (docs/ATTEND.md, "Shared
    memory"): q, k, v (and dout), then out (and dq, dk, dv), one after the other. Made with a
    random "/dattn-py-..." name and mode 0600, allocated whole at once (so that a full /dev/shm
    fails here, not as a fault when it is written), removed by close(). Linux only."""

    def __init__(self, arrays):
        import mmap
        self.tensor_bytes = arrays[0].nbytes
        self.backward = len(arrays) == 4
        count = 8 if self.backward else 4
        self.name = f"/dattn-py-{os.getpid()}-{uuid.uuid4().hex}"
        self._path = "/dev/shm" + self.name
        fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, count * self.tensor_bytes)
            except OSError as e:
                raise MemoryError(f"shared memory {self.name}: {count * self.tensor_bytes} bytes: "
                                  f"{e.strerror}; /dev/shm has no room (stream the tensors "
                                  "instead)") from None
            self._map = mmap.mmap(fd, count * self.tensor_bytes)
        except BaseException:
            os.close(fd)
            os.unlink(self._path)
            raise
        os.close(fd)
        self._bytes = np.frombuffer(self._map, np.uint8)
        try:
            for i, a in enumerate(arrays):
                self._bytes[i * self.tensor_bytes:(i + 1) * self.tensor_bytes] = \
                    a.reshape(-1).view(np.uint8)
        except BaseException:
            self.close()
            raise

    def _offset(self, tensor):
        t = tensor - attention_pb2.ATTEND_TENSOR_Q  # 0 .. 7: q, k, v, dout, out, dq, dk, dv.
        return (t if t < 4 else (4 if self.backward else 3) + t - 4) * self.tensor_bytes

    def placement(self):
        region = attention_pb2.SharedMemoryRegion(
            name=self.name, byte_size=(8 if self.backward else 4) * self.tensor_bytes)
        for t in range(attention_pb2.ATTEND_TENSOR_Q, attention_pb2.ATTEND_TENSOR_DV + 1):
            gradient = t == attention_pb2.ATTEND_TENSOR_DOUT or t > attention_pb2.ATTEND_TENSOR_OUT
            if gradient and not self.backward:
                continue
            region.tensors.add(tensor=t, offset=self._offset(t))
        return region

    def read_outputs(self, outputs):
        """Copies out (and dq, dk, dv) from the region into `outputs`."""
        for i, o in enumerate(outputs):
            at = self._offset(attention_pb2.ATTEND_TENSOR_OUT + i)
            o.reshape(-1).view(np.uint8)[:] = self._bytes[at:at + self.tensor_bytes]

    def close(self):
        del self._bytes
        self._map.close()
        os.unlink(self._path)


class _AttendAnswer:
    """Reads an Attend call's answer as the protocol has it (job_service.proto, docs/ATTEND.md):
    `accepted` first, then out (then dq, dk, dv), each tensor's chunks in order with no gap or
    overlap, every chunk 1 .. CHUNK_BYTES, each written straight into its preallocated array, then
    `done`, then nothing. Anything else raises a ProtocolError naming it."""

    _NAMES = {attention_pb2.ATTEND_TENSOR_OUT + i: n for i, n in enumerate(["out", "dq", "dk", "dv"])}

    def __init__(self, shape, dtype, backward, shared=False):
        self.outputs = [np.empty(shape, dtype=dtype) for _ in range(4 if backward else 1)]
        self._views = [o.reshape(-1).view(np.uint8) for o in self.outputs]
        # The output whose chunks come now; none come when the tensors are in shared memory.
        self._tensor = len(self.outputs) if shared else 0
        self._filled = 0   # Its bytes so far.
        self.info = None
        self.done = None

    def _expected(self):
        if self._tensor >= len(self.outputs):
            return "done"
        return f"{self._NAMES[attention_pb2.ATTEND_TENSOR_OUT + self._tensor]} at byte {self._filled}"

    def take(self, response):
        """Takes one AttendResponse; returns the AttendInfo when it is `accepted`."""
        which = response.WhichOneof("message")
        if self.done is not None:
            raise errors.ProtocolError(f"a message ({which}) after done")
        if which == "accepted":
            if self.info is not None:
                raise errors.ProtocolError(
                    f"a second accepted (job {response.accepted.job_id!r}; the first was "
                    f"{self.info.job_id!r})")
            if not response.accepted.job_id or response.accepted.num_ranks < 1:
                raise errors.ProtocolError(
                    f"accepted with job id {response.accepted.job_id!r} and "
                    f"{response.accepted.num_ranks} ranks")
            self.info = AttendInfo(response.accepted.job_id, response.accepted.num_ranks, None)
            return self.info
        if self.info is None:
            raise errors.ProtocolError(f"{which or 'an empty message'} before accepted")
        if which == "chunk":
            c = response.chunk
            name = self._NAMES.get(c.tensor, f"tensor {c.tensor}")
            if not 1 <= len(c.data) <= CHUNK_BYTES:
                raise errors.ProtocolError(
                    f"a chunk of {name} at byte {c.offset} with {len(c.data)} bytes (a chunk has "
                    f"1 .. {CHUNK_BYTES})")
            # A tensor whose last chunk came is done: the next chunk starts the next tensor.
            t = c.tensor - attention_pb2.ATTEND_TENSOR_OUT
            if t != self._tensor or c.offset != self._filled or t >= len(self.outputs):
                raise errors.ProtocolError(
                    f"a chunk of {name} at byte {c.offset}; expected {self._expected()}")
            view = self._views[t]
            end = c.offset + len(c.data)
            if end > view.size:
                raise errors.ProtocolError(
                    f"a chunk of {name} at byte {c.offset} with {len(c.data)} bytes ends past the "
                    f"tensor's {view.size} bytes")
            view[c.offset:end] = np.frombuffer(c.data, np.uint8)
            self._filled = end
            if end == view.size:
                self._tensor += 1
                self._filled = 0
            return None
        if which == "done":
            if self._tensor < len(self.outputs):
                raise errors.ProtocolError(f"done before the outputs were whole; expected "
                                           f"{self._expected()} of {self._views[0].size} bytes")
            self.done = response.done
            self.info.result = response.done
            return None
        raise errors.ProtocolError("an empty message (none of accepted, chunk, done)")

    def finish(self):
        """The stream ended OK: it must have ended with done."""
        if self.done is None:
            raise errors.ProtocolError(
                "the call ended without done" + ("" if self.info else " (and without accepted)") +
                f"; expected {self._expected()}")


class _Generation:
    """The tokens of one Generate call (Client.generate), as they come."""

    def __init__(self, call, what):
        self._call = call
        self._what = what
        self.accepted = None
        self.done = None

    def __iter__(self):
        try:
            for response in self._call:
                kind = response.WhichOneof("event")
                if kind == "accepted":
                    self.accepted = response.accepted
                elif kind == "token":
                    yield response.token
                elif kind == "done":
                    self.done = response.done
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, self._what) from None
        finally:
            self._call.cancel()  # A no-op once the call has ended; cancels it if abandoned.


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
        patterns, as numpy has no bfloat16), name, tenant (with a token: empty or the token's),
        priority, timeout (seconds for the whole call), chunk_bytes (the size of the chunks sent,
        1 .. CHUNK_BYTES, 4 MiB by default), shared_memory (False; True passes the tensors through
        a shared-memory region of this host instead of the stream: for a coordinator started with
        --attend-shared-memory on this host, whose workers run here too; docs/ATTEND.md).

        The call's job id, ring size and result are in `last_attend` (AttendInfo) once accepted.
        Raises ValueError for arrays or options that cannot be sent (before anything is sent),
        a DattnError subclass for the coordinator's errors, ProtocolError for an answer that
        breaks the protocol.
        """
        return self._attend([q, k, v], segment_lengths, dilation_rates, **options)[0]

    def attend_backward(self, q, k, v, dout, segment_lengths, dilation_rates, **options):
        """Forward and backward: returns (out, dq, dk, dv), the gradients of sum(out * dout).
        Options as attend()."""
        return tuple(self._attend([q, k, v, dout], segment_lengths, dilation_rates, **options))

    def _attend(self, tensors, segment_lengths, dilation_rates, *, causal=False, mode="grouped",
                scale=None, head_offsets=None, num_ranks=0, device="any", dtype=None, name="",
                tenant="", priority=0, timeout=None, chunk_bytes=CHUNK_BYTES,
                shared_memory=False):
        names = ["q", "k", "v", "dout"]
        arrays = []
        for i, t in enumerate(tensors):
            a = np.asarray(t)
            if a.ndim != 4:
                raise ValueError(f"{names[i]}: a (B, N, H, D) array, got {a.ndim} dimensions")
            if i > 0 and a.shape != arrays[0].shape:
                raise ValueError(f"{names[i]}: shape {a.shape} differs from q's {arrays[0].shape}")
            if a.size == 0:
                raise ValueError(f"{names[i]}: shape {a.shape} has no elements")
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
        _check_choices(mode, head_offsets, device)
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or \
                not 1 <= chunk_bytes <= CHUNK_BYTES:
            raise ValueError(f"chunk_bytes: {chunk_bytes!r}; a chunk has 1 .. {CHUNK_BYTES} bytes")

        start = job_service_pb2.AttendStart(
            dtype=wire, num_ranks=num_ranks, backward=len(arrays) == 4, device=_DEVICES[device],
            name=name, tenant=tenant, priority=priority)
        _fill_attention(start.attention, segment_lengths, dilation_rates, causal, mode, scale,
                        head_offsets)
        b, n, h, d = arrays[0].shape
        start.shape.batch, start.shape.seq_len, start.shape.num_heads, start.shape.head_dim = (
            b, n, h, d)

        region = _SharedRegion(arrays) if shared_memory else None
        if region is not None:
            start.shared_memory.CopyFrom(region.placement())

        def requests():
            yield job_service_pb2.AttendRequest(start=start)
            if region is not None:
                return  # The tensors are in the region.
            for i, a in enumerate(arrays):
                data = memoryview(a.reshape(-1)).cast("B")
                for offset in range(0, len(data), chunk_bytes):
                    yield job_service_pb2.AttendRequest(chunk=attention_pb2.AttendChunk(
                        tensor=attention_pb2.ATTEND_TENSOR_Q + i, offset=offset,
                        data=bytes(data[offset:offset + chunk_bytes])))

        reader = _AttendAnswer(arrays[0].shape, held, len(arrays) == 4, region is not None)
        try:
            call = self._jobs.Attend(requests(), metadata=self._metadata, timeout=timeout)
            try:
                for response in call:
                    accepted = reader.take(response)
                    if accepted is not None:
                        self.last_attend = accepted
            except grpc.RpcError as e:
                raise errors.from_rpc_error(e, "attend") from None
            except BaseException:
                call.cancel()  # A ProtocolError or an interrupt: the coordinator cancels the job.
                raise
            reader.finish()
            if region is not None:
                region.read_outputs(reader.outputs)
        finally:
            if region is not None:
                region.close()
        return reader.outputs

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
            try:
                spec = json_format.ParseDict(spec, job_pb2.JobSpec())
            except json_format.ParseError as e:
                raise ValueError(f"spec: not a JobSpec in its JSON form: {e}") from None
        request = job_service_pb2.SubmitJobRequest(
            idempotency_key=idempotency_key or str(uuid.uuid4()), spec=spec)
        return self._call(self._jobs.SubmitJob, request, "submit").job

    def submit_attention(self, seq_len, num_heads, head_dim, segment_lengths, dilation_rates, *,
                         batch=1, dtype="fp32", causal=False, mode="grouped", scale=None,
                         head_offsets=None, num_ranks=1, backward=False, iterations=1, seed=0,
                         return_output=False, device="any", name="", tenant="", priority=0,
                         idempotency_key=None):
        """An attention job on generated inputs (standard-normal q, k, v from `seed`), as `dattn
        submit` makes it; backward=True runs forward + backward. Returns the Job; watch() or wait()
        follow it, read_output() reads its output when return_output was set."""
        if dtype not in _NAMED_DTYPES:
            raise ValueError(f"dtype: {dtype!r} is not one of {sorted(_NAMED_DTYPES)}")
        _check_choices(mode, head_offsets, device)
        work = job_pb2.AttentionJobSpec(
            dtype=_NAMED_DTYPES[dtype], num_ranks=num_ranks, iterations=iterations, seed=seed,
            return_output=return_output, device=_DEVICES[device],
            **{"pass": job_pb2.PASS_FORWARD_BACKWARD if backward else job_pb2.PASS_FORWARD})
        _fill_attention(work.attention, segment_lengths, dilation_rates, causal, mode, scale,
                        head_offsets)
        work.shape.batch, work.shape.seq_len = batch, seq_len
        work.shape.num_heads, work.shape.head_dim = num_heads, head_dim
        return self.submit(job_pb2.JobSpec(name=name, tenant=tenant, priority=priority,
                                           attention=work), idempotency_key)

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

    # ---- Deployments (docs/SERVING.md) ------------------------------------------------------------

    def deploy(self, checkpoint=None, *, model=None, version=0, training_job_id=None, step=0,
               max_context=0, max_batch=0, max_queued=0, ranks=0, device="any", name="",
               priority=0, wait=None, idempotency_key=None):
        """Submits a deployment of a checkpoint step folder or an imported model's folder
        (config.json and safetensors weights; docs/SERVING.md), or of a registered `model` (its
        newest version, or `version`; import_model), or of a succeeded training job's final
        checkpoint, or with `step` of any saved step of a training job, and returns its Job.
        With `ranks` > 1 it runs on that many workers as one ring, each keeping 1/ranks of every
        sequence's cache. `device`: "any" (a GPU worker when one has room), "cpu" (fp32) or
        "gpu" (bf16; with ranks > 1 a ring of GPUs over NCCL); the job's progress.deployment.device says
        what serves it.
        With `wait` (seconds), follows it until it serves and returns the Job then; raises
        DattnError if it ends first or the wait runs out."""
        if (checkpoint is not None) + (model is not None) + (training_job_id is not None) != 1:
            raise ValueError("checkpoint, model or training_job_id: give one of them")
        if version and model is None:
            raise ValueError("version: only with model (a version of a registered model)")
        if step and training_job_id is None:
            raise ValueError("step: only with training_job_id (a step of its checkpoints)")
        if device not in _DEVICES:
            raise ValueError(f"device: {device!r} is not one of {sorted(_DEVICES)}")
        spec = job_pb2.JobSpec(name=name, priority=priority, deployment=job_pb2.DeploymentSpec(
            checkpoint=checkpoint or "", model=model or "", model_version=version,
            training_job_id=training_job_id or "",
            training_job_step=step, max_context=max_context, max_batch=max_batch,
            max_queued=max_queued, ranks=ranks, device=_DEVICES[device]))
        job = self.submit(spec, idempotency_key)
        if wait is None:
            return job
        deadline = time.monotonic() + wait
        while True:
            job = self.get_job(job.job_id)
            if job.state == job_pb2.JOB_STATE_RUNNING and job.progress.deployment.ready:
                return job
            if job.state in _TERMINAL:
                raise errors.DattnError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"deployment {job.job_id} ended {job_pb2.JobState.Name(job.state)}: "
                    f"{job.state_reason}", "deploy")
            if time.monotonic() > deadline:
                raise errors.DattnError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"deployment {job.job_id} is not serving after {wait} s "
                    f"({job_pb2.JobState.Name(job.state)}: {job.state_reason})", "deploy")
            time.sleep(0.2)

    # ---- The model registry (docs/SERVING.md "The model registry") ----------------------------

    def import_model(self, name, path=None, *, training_job_id=None, step=0, description="",
                     timeout=3600):
        """Copies a model into the coordinator's registry as the next version of `name` and
        returns its RegisteredModel (version, folder, parameters, weights, bytes): a folder the
        coordinator reads (`path`: a checkpoint step or an imported model), or a training job's
        final checkpoint (`training_job_id`), or with `step` one of its saved steps. The copy may
        take a while: `timeout` seconds (default an hour); giving up cancels it."""
        if (path is None) == (training_job_id is None):
            raise ValueError("path or training_job_id: give one of them")
        if step and training_job_id is None:
            raise ValueError("step: only with training_job_id (a step of its checkpoints)")
        request = job_service_pb2.ImportModelRequest(
            name=name, path=path or "", training_job_id=training_job_id or "",
            training_job_step=step, description=description)
        try:
            return self._jobs.ImportModel(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"import model {name}") from None

    def list_models(self, name=""):
        """The registered models' versions (RegisteredModel), of `name` only when given, by name
        then version."""
        request = job_service_pb2.ListModelsRequest(name=name)
        return list(self._call(self._jobs.ListModels, request, "list models").models)

    def delete_model(self, name, version=0):
        """Removes `version` of a registered model, or every version (0); returns the
        DeleteModelResponse (versions, bytes_freed). FailedPrecondition while a deployment that
        has not ended serves it."""
        request = job_service_pb2.DeleteModelRequest(name=name, version=version)
        return self._call(self._jobs.DeleteModel, request, f"delete model {name}")

    def generate(self, deployment_id, prompt, *, max_tokens=16, temperature=0.0, top_k=0,
                 top_p=1.0, seed=0, stop=(), priority=0, timeout=None):
        """Continues `prompt` on a deployment: an iterator of GeneratedToken (token, logprob) as
        they are made; afterwards its `done` holds the GenerateDone (finish_reason, counts, times)
        and `accepted` the request's id. `prompt` and each `stop` are text (str or bytes, for
        byte-level models) or lists of token ids. Closing the iterator early (break) cancels the
        request on the deployment."""
        request = job_service_pb2.GenerateRequest(
            deployment_id=deployment_id, max_tokens=max_tokens, priority=priority,
            sampling=job_service_pb2.SamplingParams(temperature=temperature, top_k=top_k,
                                                    top_p=top_p, seed=seed))
        if isinstance(prompt, (str, bytes)):
            request.prompt_text = prompt.encode() if isinstance(prompt, str) else prompt
        else:
            request.prompt.extend(int(t) for t in prompt)
        if isinstance(stop, (str, bytes)):
            raise ValueError("stop: a list of stop sequences (each text or token ids), not one")
        for s in stop:
            if isinstance(s, (str, bytes)):
                request.stop_text.append(s.encode() if isinstance(s, str) else s)
            else:
                request.stop.add(tokens=[int(t) for t in s])
        return _Generation(self._jobs.Generate(request, metadata=self._metadata, timeout=timeout),
                           f"generate on deployment {deployment_id}")

    def score(self, deployment_id, tokens):
        """log p(tokens[i+1] | tokens[..i]) for each token after the first, and their mean loss:
        a ScoreResponse. `tokens`: text (str or bytes, byte-level models) or token ids."""
        request = job_service_pb2.ScoreRequest(deployment_id=deployment_id)
        if isinstance(tokens, (str, bytes)):
            request.text = tokens.encode() if isinstance(tokens, str) else tokens
        else:
            request.tokens.extend(int(t) for t in tokens)
        return self._call(self._jobs.Score, request, f"score on deployment {deployment_id}")

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
        uint16 bit patterns): the header first (dtype, shape), then the bytes in order, each chunk
        written into the preallocated array."""
        out, view, filled = None, None, 0
        stream = self._jobs.ReadOutput(job_service_pb2.ReadOutputRequest(job_id=job_id),
                                       metadata=self._metadata, timeout=self.timeout)
        try:
            for chunk in stream:
                if chunk.HasField("header"):
                    if view is not None:
                        raise errors.ProtocolError(f"output of {job_id}: a second header at byte "
                                                   f"{chunk.offset}")
                    held = _HELD_AS.get(chunk.header.dtype)
                    if held is None or any(d < 0 for d in chunk.header.shape):
                        raise errors.ProtocolError(
                            f"output of {job_id}: a header of dtype {chunk.header.dtype} and "
                            f"shape {list(chunk.header.shape)}")
                    out = np.empty(tuple(chunk.header.shape), dtype=held)
                    view = out.reshape(-1).view(np.uint8)
                if view is None:
                    raise errors.ProtocolError(f"output of {job_id}: a chunk before the header")
                if chunk.offset != filled or chunk.offset + len(chunk.data) > view.size:
                    raise errors.ProtocolError(
                        f"output of {job_id}: a chunk at byte {chunk.offset} with "
                        f"{len(chunk.data)} bytes; expected byte {filled} of {view.size}")
                view[filled:filled + len(chunk.data)] = np.frombuffer(chunk.data, np.uint8)
                filled += len(chunk.data)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"read output of {job_id}") from None
        except BaseException:
            stream.cancel()
            raise
        if view is None or filled != view.size:
            raise errors.ProtocolError(
                f"output of {job_id}: the stream ended at byte {filled}" +
                (f" of {view.size}" if view is not None else " without a header"))
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
