"""Unit tests of the Python client (python/dattn_client) against an in-process gRPC server: a fake
JobService (and grpc.health.v1) that checks what the client sends (the start, every chunk's tensor,
offset and size, the total bytes, the token) and answers with outputs computed by the float64
reference of python/tests/reference.py, or with a scripted answer that breaks the protocol.
test_cluster.py runs the client against the real coordinator and workers."""

import concurrent.futures
import hashlib
import importlib.util
import os
import tempfile
import unittest
from unittest import mock

import grpc
import numpy as np

import dattn_client
import reference
from dattn.v1 import attention_pb2, job_pb2, job_service_pb2, job_service_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_WIRE = {attention_pb2.DTYPE_FP64: np.dtype("<f8"), attention_pb2.DTYPE_FP32: np.dtype("<f4"),
         attention_pb2.DTYPE_FP16: np.dtype("<f2"), attention_pb2.DTYPE_BF16: np.dtype("<u2")}
_MODES = {attention_pb2.ATTENTION_MODE_GROUPED: "grouped",
          attention_pb2.ATTENTION_MODE_MIXTURE: "mixture"}


class FakeJobs(job_service_pb2_grpc.JobServiceServicer):
    """JobService.Attend as the protocol says the coordinator answers (job_service.proto): checks
    every message of the client and aborts INVALID_ARGUMENT naming what is wrong (the test then
    fails on that exception); answers accepted, the outputs of the reference in `out_chunk`-byte
    chunks, done. `echo`: the outputs are the inputs sent back (q as out, then k, v, dout as dq, dk,
    dv) instead of the reference's, for sizes the reference is too slow for. `fail`: the next call
    aborts with that (code, details) after reading its start. `script`: the next call reads the
    whole request and answers these AttendResponses verbatim. Also ReadOutput (`output`: the array
    it streams, `output_script`: TensorChunks verbatim) and WatchJob (NOT_FOUND for any job but
    "j-1")."""

    def __init__(self):
        self.starts = []        # The AttendStart of every call.
        self.chunks = []        # (tensor, offset, size) of every chunk of every call.
        self.received = []      # The sha256 of each input tensor of the last call.
        self.metadata = []      # The invocation metadata of every call.
        self.fail = None
        self.script = None
        self.echo = False
        self.out_chunk = 1000
        self.output = None
        self.output_script = None

    def Attend(self, request_iterator, context):
        self.metadata.append(dict(context.invocation_metadata()))
        first = next(request_iterator)
        if first.WhichOneof("message") != "start":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start: required in the first message")
        s = first.start
        self.starts.append(s)
        if self.fail:
            code, details = self.fail
            self.fail = None
            context.abort(code, details)
        shape = (s.shape.batch, s.shape.seq_len, s.shape.num_heads, s.shape.head_dim)
        dtype = _WIRE[s.dtype]
        total = int(np.prod(shape)) * dtype.itemsize
        count = 4 if s.backward else 3
        data = [bytearray() for _ in range(count)]
        current = 0
        for message in request_iterator:
            if message.WhichOneof("message") != "chunk":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a second start")
            c = message.chunk
            t = c.tensor - attention_pb2.ATTEND_TENSOR_Q
            self.chunks.append((c.tensor, c.offset, len(c.data)))
            if t != current:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"chunk.tensor: expected {current + 1}, got {c.tensor}")
            if c.offset != len(data[t]):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"chunk of {t}: offset {c.offset}, expected {len(data[t])}")
            if not 1 <= len(c.data) <= dattn_client.CHUNK_BYTES:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"chunk of {len(c.data)} bytes")
            if len(data[t]) + len(c.data) > total:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"chunk of {t} ends past {total}")
            data[t] += c.data
            if len(data[t]) == total:
                current += 1
                if current == count:
                    break  # As the coordinator: nothing after the last input chunk is read.
        if current != count:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the stream ended with tensor {current} incomplete")
        self.received = [hashlib.sha256(bytes(d)).hexdigest() for d in data]
        if self.script is not None:
            script, self.script = self.script, None
            yield from script
            return
        yield job_service_pb2.AttendResponse(
            accepted=job_service_pb2.AttendAccepted(job_id="j-fake", num_ranks=max(s.num_ranks, 1)))
        inputs = [np.frombuffer(bytes(d), dtype).reshape(shape) for d in data]
        if self.echo:
            outputs = inputs if s.backward else inputs[:1]
        else:
            a = s.attention
            result = reference.attention(
                *inputs[:3], list(a.segment_lengths), list(a.dilation_rates), causal=a.causal,
                mode=_MODES[a.mode],
                head_offsets="blocked" if a.head_offsets == attention_pb2.HEAD_OFFSETS_BLOCKED
                else "modulo",
                scale=a.scale if a.HasField("scale") else None,
                dout=inputs[3] if s.backward else None)
            outputs = [x.astype(dtype) for x in (result if s.backward else [result])]
        for t, o in enumerate(outputs):
            raw = o.tobytes()
            for offset in range(0, len(raw), self.out_chunk):
                yield job_service_pb2.AttendResponse(chunk=attention_pb2.AttendChunk(
                    tensor=attention_pb2.ATTEND_TENSOR_OUT + t, offset=offset,
                    data=raw[offset:offset + self.out_chunk]))
        yield job_service_pb2.AttendResponse(done=job_pb2.AttentionJobResult(tflops=1.5))

    def ReadOutput(self, request, context):
        if self.output_script is not None:
            yield from self.output_script
            return
        o = self.output
        raw = o.tobytes()
        wire = {v: k for k, v in _WIRE.items()}[o.dtype.newbyteorder("<")]
        for offset in range(0, len(raw), 700):
            chunk = attention_pb2.TensorChunk(offset=offset, data=raw[offset:offset + 700])
            if offset == 0:
                chunk.header.dtype = wire
                chunk.header.shape.extend(o.shape)
            yield chunk

    def WatchJob(self, request, context):
        if request.job_id != "j-1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id}: no such job")
        for seq, kind in enumerate(["submitted", "started", "succeeded"], 1):
            if seq > request.after_seq:
                yield job_pb2.JobEvent(seq=seq, kind=kind)


class FakeHealth(health_pb2_grpc.HealthServicer):
    def Check(self, request, context):
        if request.service not in ("", "dattn.v1.JobService"):
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


def chunk(tensor, offset, data):
    return job_service_pb2.AttendResponse(
        chunk=attention_pb2.AttendChunk(tensor=tensor, offset=offset, data=data))


ACCEPTED = job_service_pb2.AttendResponse(
    accepted=job_service_pb2.AttendAccepted(job_id="j-s", num_ranks=1))
DONE = job_service_pb2.AttendResponse(done=job_pb2.AttentionJobResult())
OUT = attention_pb2.ATTEND_TENSOR_OUT


class FakeServerTest(unittest.TestCase):
    def setUp(self):
        self.jobs = FakeJobs()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4),
                                  options=[("grpc.max_receive_message_length", 32 << 20)])
        job_service_pb2_grpc.add_JobServiceServicer_to_server(self.jobs, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(FakeHealth(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"
        self.client = dattn_client.Client(self.address, insecure=True, token="")

    def tearDown(self):
        self.client.close()
        self.server.stop(None)

    def rand(self, seed, shape, count, dtype=np.float64):
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(shape).astype(dtype) for _ in range(count)]

    # ---- attend and attend_backward: what is sent, what comes back ---------------------------

    def test_attend_sends_the_problem_and_assembles_the_reference_output(self):
        q, k, v = self.rand(1, (2, 32, 4, 8), 3, np.float32)
        out = self.client.attend(q, k, v, [8, 16], [1, 2], num_ranks=2, device="cpu", name="n",
                                 priority=5, tenant="t")
        self.assertEqual(out.dtype, np.float32)
        self.assertEqual(out.shape, q.shape)
        np.testing.assert_allclose(out, reference.attention(q, k, v, [8, 16], [1, 2]),
                                   rtol=1e-5, atol=1e-6)
        start = self.jobs.starts[0]
        self.assertEqual(list(start.attention.segment_lengths), [8, 16])
        self.assertEqual(list(start.attention.dilation_rates), [1, 2])
        self.assertFalse(start.attention.causal)
        self.assertFalse(start.attention.HasField("scale"))
        self.assertEqual(start.attention.mode, attention_pb2.ATTENTION_MODE_GROUPED)
        self.assertEqual((start.shape.batch, start.shape.seq_len, start.shape.num_heads,
                          start.shape.head_dim), (2, 32, 4, 8))
        self.assertEqual(start.dtype, attention_pb2.DTYPE_FP32)
        self.assertEqual(start.num_ranks, 2)
        self.assertEqual(start.device, job_pb2.DEVICE_PREFERENCE_CPU)
        self.assertEqual((start.name, start.priority, start.tenant), ("n", 5, "t"))
        self.assertFalse(start.backward)
        # Each tensor's bytes as they are in the arrays, q, k, v in order.
        self.assertEqual(self.jobs.received, [hashlib.sha256(x.tobytes()).hexdigest()
                                              for x in (q, k, v)])
        self.assertEqual([t for t, _, _ in self.jobs.chunks],
                         [attention_pb2.ATTEND_TENSOR_Q, attention_pb2.ATTEND_TENSOR_K,
                          attention_pb2.ATTEND_TENSOR_V])
        self.assertEqual(self.client.last_attend.job_id, "j-fake")
        self.assertEqual(self.client.last_attend.num_ranks, 2)
        self.assertAlmostEqual(self.client.last_attend.result.tflops, 1.5)

    def test_backward_returns_out_and_the_gradients(self):
        q, k, v, dout = self.rand(2, (1, 24, 3, 4), 4)
        out, dq, dk, dv = self.client.attend_backward(
            q, k, v, dout, [8, 12], [1, 3], causal=True, mode="mixture", head_offsets="blocked",
            scale=0.3)
        start = self.jobs.starts[0]
        self.assertTrue(start.backward)
        self.assertTrue(start.attention.causal)
        self.assertEqual(start.attention.mode, attention_pb2.ATTENTION_MODE_MIXTURE)
        self.assertEqual(start.attention.head_offsets, attention_pb2.HEAD_OFFSETS_BLOCKED)
        self.assertEqual(start.attention.scale, 0.3)
        self.assertEqual(start.dtype, attention_pb2.DTYPE_FP64)
        self.assertEqual(self.jobs.received[3], hashlib.sha256(dout.tobytes()).hexdigest())
        want = reference.attention(q, k, v, [8, 12], [1, 3], causal=True, mode="mixture",
                                   head_offsets="blocked", scale=0.3, dout=dout)
        for name, got, expected in zip(["out", "dq", "dk", "dv"], (out, dq, dk, dv), want):
            np.testing.assert_array_equal(got, expected, err_msg=name)

    def test_tensors_over_4_mib_go_in_chunks_of_4_mib_and_come_back_whole(self):
        self.jobs.echo = True
        self.jobs.out_chunk = dattn_client.CHUNK_BYTES
        q, k, v = self.rand(3, (1, 2048, 4, 96), 3)  # 6 MiB a tensor: two chunks each way.
        out = self.client.attend(q, k, v, [64], [1])
        size = q.nbytes
        c = dattn_client.CHUNK_BYTES
        self.assertEqual(self.jobs.chunks, [(t, 0, c) if i == 0 else (t, c, size - c)
                                            for t in (1, 2, 3) for i in (0, 1)])
        self.assertEqual(self.jobs.received, [hashlib.sha256(x.tobytes()).hexdigest()
                                              for x in (q, k, v)])
        np.testing.assert_array_equal(out, q)

    def test_chunk_bytes_sets_the_size_of_the_chunks_sent(self):
        self.jobs.echo = True
        q, k, v, dout = self.rand(4, (1, 10, 2, 5), 4)  # 800 bytes a tensor.
        out, dq, dk, dv = self.client.attend_backward(q, k, v, dout, [10], [1], chunk_bytes=300)
        self.assertEqual([(o, n) for _, o, n in self.jobs.chunks], [(0, 300), (300, 300),
                                                                    (600, 200)] * 4)
        for got, sent in zip((out, dq, dk, dv), (q, k, v, dout)):
            np.testing.assert_array_equal(got, sent)

    def test_arrays_are_sent_c_contiguous_and_little_endian(self):
        self.jobs.echo = True
        base = self.rand(5, (1, 4, 8, 3), 1)[0]
        q = base.transpose(0, 2, 1, 3)  # (1, 8, 4, 3), not contiguous.
        k = np.ascontiguousarray(q).astype(">f8")  # Big-endian.
        v = np.asfortranarray(q)
        out = self.client.attend(q, k, v, [8], [1])
        little = np.ascontiguousarray(q, dtype="<f8").tobytes()
        self.assertEqual(self.jobs.received, [hashlib.sha256(little).hexdigest()] * 3)
        np.testing.assert_array_equal(out, q)
        self.assertEqual(out.dtype, np.dtype("<f8"))

    def test_float16_and_bf16_bits_travel_as_their_dtypes(self):
        q, k, v = self.rand(6, (1, 16, 2, 4), 3, np.float16)
        out = self.client.attend(q, k, v, [16], [1])
        self.assertEqual(self.jobs.starts[-1].dtype, attention_pb2.DTYPE_FP16)
        self.assertEqual(out.dtype, np.float16)
        np.testing.assert_allclose(out, reference.attention(q, k, v, [16], [1]), atol=2e-3)
        self.jobs.echo = True
        bits = [(x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) for x in (q, k, v)]
        out = self.client.attend(*bits, [16], [1], dtype="bf16")
        self.assertEqual(self.jobs.starts[-1].dtype, attention_pb2.DTYPE_BF16)
        self.assertEqual(out.dtype, np.uint16)
        np.testing.assert_array_equal(out, bits[0])

    # ---- errors --------------------------------------------------------------------------------

    def test_every_status_code_is_its_exception_with_code_and_details(self):
        q = np.zeros((1, 8, 1, 4), np.float32)
        classes = {
            grpc.StatusCode.INVALID_ARGUMENT: dattn_client.InvalidArgument,
            grpc.StatusCode.NOT_FOUND: dattn_client.NotFound,
            grpc.StatusCode.ALREADY_EXISTS: dattn_client.AlreadyExists,
            grpc.StatusCode.RESOURCE_EXHAUSTED: dattn_client.ResourceExhausted,
            grpc.StatusCode.FAILED_PRECONDITION: dattn_client.FailedPrecondition,
            grpc.StatusCode.UNAVAILABLE: dattn_client.Unavailable,
            grpc.StatusCode.PERMISSION_DENIED: dattn_client.PermissionDenied,
            grpc.StatusCode.UNAUTHENTICATED: dattn_client.Unauthenticated,
            grpc.StatusCode.DEADLINE_EXCEEDED: dattn_client.DeadlineExceeded,
            grpc.StatusCode.CANCELLED: dattn_client.Cancelled,
            grpc.StatusCode.INTERNAL: dattn_client.DattnError,
        }
        for code, cls in classes.items():
            self.jobs.fail = (code, f"start.dtype: required ({code.name})")
            with self.assertRaises(cls, msg=code.name) as e:
                self.client.attend(q, q, q, [8], [1])
            self.assertIsInstance(e.exception, dattn_client.DattnError)
            self.assertEqual(e.exception.code, code)
            self.assertEqual(e.exception.details, f"start.dtype: required ({code.name})")
            self.assertIn(f"start.dtype: required ({code.name})", str(e.exception))

    def test_bad_arrays_and_options_are_value_errors_before_anything_is_sent(self):
        q = np.zeros((1, 8, 1, 4), np.float32)
        cases = [
            (dict(k=np.zeros((1, 8, 2, 4), np.float32)), "k: shape"),
            (dict(v=q.astype(np.float64)), "v: dtype float64"),
            (dict(q=q[0], k=q[0], v=q[0]), r"q: a \(B, N, H, D\) array"),
            (dict(q=q.astype(np.int32)), "q: dtype int32"),
            (dict(q=q[:, :0], k=q[:, :0], v=q[:, :0]), "q: shape .* has no elements"),
            (dict(segment_lengths=[8, 16]), "one rate per segment length"),
            (dict(dtype="bf16"), "q: dtype float32"),
            (dict(dtype="int8"), "dtype: 'int8'"),
            (dict(mode="sparse"), "mode: 'sparse'"),
            (dict(head_offsets="odd"), "head_offsets: 'odd'"),
            (dict(device="tpu"), "device: 'tpu'"),
            (dict(chunk_bytes=0), "chunk_bytes: 0"),
            (dict(chunk_bytes=dattn_client.CHUNK_BYTES + 1), "chunk_bytes: 4194305"),
        ]
        for change, message in cases:
            args = dict(q=q, k=q, v=q, segment_lengths=[8], dilation_rates=[1])
            args.update(change)
            with self.assertRaisesRegex(ValueError, message):
                self.client.attend(**args)
        with self.assertRaisesRegex(ValueError, "dout: shape"):
            self.client.attend_backward(q, q, q, q[:, :4], [8], [1])
        self.assertEqual(self.jobs.starts, [])

    def test_answers_that_break_the_protocol_are_protocol_errors(self):
        q = np.zeros((1, 4, 1, 2), np.float32)  # 32 bytes a tensor.
        full, half = bytes(32), bytes(16)
        cases = [
            ([chunk(OUT, 0, full), DONE], "chunk before accepted"),
            ([ACCEPTED, ACCEPTED], "a second accepted"),
            ([ACCEPTED, chunk(OUT, 16, half)], "a chunk of out at byte 16; expected out at byte 0"),
            ([ACCEPTED, chunk(OUT, 0, half), chunk(OUT, 0, half)],
             "a chunk of out at byte 0; expected out at byte 16"),
            ([ACCEPTED, chunk(OUT + 1, 0, full)], "a chunk of dq at byte 0; expected out"),
            ([ACCEPTED, chunk(attention_pb2.ATTEND_TENSOR_Q, 0, full)], "tensor 1 at byte 0"),
            ([ACCEPTED, chunk(OUT, 0, bytes(48))], "ends past the tensor's 32 bytes"),
            ([ACCEPTED, chunk(OUT, 0, b"")], "with 0 bytes"),
            ([ACCEPTED, chunk(OUT, 0, half), DONE], "done before the outputs were whole"),
            ([ACCEPTED, chunk(OUT, 0, full), chunk(OUT + 1, 0, full)],
             "a chunk of dq at byte 0; expected done"),
            ([ACCEPTED, chunk(OUT, 0, full)], "the call ended without done"),
            ([], "without done .and without accepted."),
            ([ACCEPTED, chunk(OUT, 0, full), DONE, DONE], r"a message \(done\) after done"),
        ]
        for script, message in cases:
            self.jobs.script = script
            with self.assertRaisesRegex(dattn_client.ProtocolError, message, msg=message):
                self.client.attend(q, q, q, [4], [1])
        # A chunk over 4 MiB, of a tensor that large.
        big = np.zeros((1, 1 << 17, 1, 8), np.float32)  # 4 MiB exactly; the chunk 4 MiB + 1.
        self.jobs.script = [ACCEPTED, chunk(OUT, 0, bytes(dattn_client.CHUNK_BYTES + 1))]
        with self.assertRaisesRegex(dattn_client.ProtocolError, "4194305 bytes .a chunk has 1"):
            self.client.attend(big, big, big, [8], [1])
        # Backward: dq only after out, each output whole.
        self.jobs.script = [ACCEPTED, chunk(OUT, 0, full), chunk(OUT + 2, 0, full)]
        with self.assertRaisesRegex(dattn_client.ProtocolError, "a chunk of dk at byte 0; "
                                    "expected dq at byte 0"):
            self.client.attend_backward(q, q, q, q, [4], [1])

    # ---- the connection's settings, as the CLI's ------------------------------------------------

    def test_the_token_goes_as_a_bearer_header_and_never_in_plaintext_unless_insecure(self):
        q = np.zeros((1, 4, 1, 2), np.float32)
        with self.assertRaisesRegex(ValueError, "a bearer token goes only over TLS"):
            dattn_client.Client(self.address, token="secret")
        with mock.patch.dict(os.environ, {"DATTN_TOKEN": "  from-env\n",
                                          "DATTN_COORDINATOR": self.address}):
            os.environ.pop("DATTN_TLS_CA", None)
            with self.assertRaisesRegex(ValueError, "a bearer token goes only over TLS"):
                dattn_client.Client()
            with dattn_client.Client(insecure=True) as c:
                self.assertEqual(c.address, self.address)
                c.attend(q, q, q, [4], [1])
        self.assertEqual(self.jobs.metadata[-1].get("authorization"), "Bearer from-env")
        with tempfile.NamedTemporaryFile("w", suffix=".token") as f:
            f.write(" from-file \nsecond line\n")
            f.flush()
            with dattn_client.Client(self.address, token_file=f.name, insecure=True) as c:
                c.attend(q, q, q, [4], [1])
            self.assertEqual(self.jobs.metadata[-1].get("authorization"), "Bearer from-file")
        with tempfile.NamedTemporaryFile("w") as f:
            f.write("\n")
            f.flush()
            with self.assertRaisesRegex(ValueError, "its first line holds no token"):
                dattn_client.Client(self.address, token_file=f.name, insecure=True)
        with self.assertRaisesRegex(ValueError, "token_file /nonexistent: cannot be read"):
            dattn_client.Client(self.address, token_file="/nonexistent", insecure=True)
        with mock.patch.dict(os.environ, {"DATTN_TOKEN": " "}):
            with dattn_client.Client(self.address) as c:  # No token, no CA: plaintext is fine.
                c.attend(q, q, q, [4], [1])
        self.assertNotIn("authorization", self.jobs.metadata[-1])
        with self.assertRaisesRegex(ValueError, "ca /nonexistent.pem: cannot be read"):
            dattn_client.Client(self.address, ca="/nonexistent.pem")

    def test_unreachable_coordinator_is_unavailable(self):
        client = dattn_client.Client("127.0.0.1:1", insecure=True, timeout=2)
        with self.assertRaises(dattn_client.Unavailable):
            client.get_job("j-0")
        with self.assertRaises(dattn_client.Unavailable):
            client.attend(*[np.zeros((1, 4, 1, 2))] * 3, [4], [1], timeout=2)

    # ---- jobs ----------------------------------------------------------------------------------

    def test_read_output_assembles_the_chunks_after_the_header(self):
        self.jobs.output = self.rand(7, (2, 30, 3, 5), 1, np.float32)[0]
        out = self.client.read_output("j-1")
        self.assertEqual(out.dtype, np.float32)
        np.testing.assert_array_equal(out, self.jobs.output)
        header = attention_pb2.TensorChunk(data=bytes(8))
        header.header.dtype = attention_pb2.DTYPE_FP32
        header.header.shape.extend([1, 4])
        cases = [
            ([attention_pb2.TensorChunk(data=bytes(8))], "a chunk before the header"),
            ([header, header], "a second header"),
            ([header, attention_pb2.TensorChunk(offset=4, data=bytes(4))],
             "a chunk at byte 4 with 4 bytes; expected byte 8 of 16"),
            ([header], "the stream ended at byte 8 of 16"),
            ([], "ended at byte 0 without a header"),
        ]
        for script, message in cases:
            self.jobs.output_script = script
            with self.assertRaisesRegex(dattn_client.ProtocolError, message):
                self.client.read_output("j-1")

    def test_watch_yields_the_events_and_raises_not_found(self):
        self.assertEqual([e.kind for e in self.client.watch("j-1")],
                         ["submitted", "started", "succeeded"])
        self.assertEqual([e.seq for e in self.client.watch("j-1", after_seq=1)], [2, 3])
        with self.assertRaises(dattn_client.NotFound) as e:
            list(self.client.watch("j-2"))
        self.assertIn("job j-2: no such job", e.exception.details)

    def test_submit_takes_a_dict_in_json_form(self):
        with self.assertRaisesRegex(ValueError, "spec: not a JobSpec"):
            self.client.submit({"attention": {"noSuchField": 1}})
        # The fake has no SubmitJob: its UNIMPLEMENTED comes back as a DattnError.
        with self.assertRaises(dattn_client.DattnError) as e:
            self.client.submit({"attention": {"shape": {"seqLen": 8}}})
        self.assertEqual(e.exception.code, grpc.StatusCode.UNIMPLEMENTED)

    def test_health(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health("dattn.v1.JobService"), "SERVING")
        with self.assertRaises(dattn_client.NotFound):
            self.client.health("no.Such")


class ReferenceTest(unittest.TestCase):
    """The tests' reference (python/tests/reference.py) against the repository's numpy
    re-implementation of the engine's function (model/testing/longnet_reference.py, causal only)
    and its gradients against central differences."""

    def test_forward_equals_longnet_reference(self):
        spec = importlib.util.spec_from_file_location("longnet_reference",
                                                      os.environ["DATTN_REFERENCE_PY"])
        longnet = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(longnet)
        rng = np.random.default_rng(8)
        q, k, v = (rng.standard_normal((2, 30, 5, 4)) for _ in range(3))
        for mode, offsets in (("grouped", "modulo"), ("mixture", "modulo"),
                              ("mixture", "blocked")):
            np.testing.assert_allclose(
                reference.attention(q, k, v, [8, 16], [1, 3], causal=True, mode=mode,
                                    head_offsets=offsets),
                longnet.dilated_attention(q, k, v, [8, 16], [1, 3], mode, offsets),
                rtol=1e-12, atol=1e-14, err_msg=f"{mode} {offsets}")

    def test_backward_equals_central_differences(self):
        rng = np.random.default_rng(9)
        q, k, v, dout = (rng.standard_normal((1, 10, 3, 3)) for _ in range(4))
        for causal in (False, True):
            for mode in ("grouped", "mixture"):
                grads = reference.attention(q, k, v, [4, 8], [1, 2], causal=causal, mode=mode,
                                            dout=dout)[1:]

                def loss(*qkv):
                    return float(np.sum(reference.attention(
                        *qkv, [4, 8], [1, 2], causal=causal, mode=mode) * dout))
                for which, grad in enumerate(grads):
                    numeric = np.zeros_like(grad)
                    for idx in np.ndindex(grad.shape):
                        args = [q.copy(), k.copy(), v.copy()]
                        args[which][idx] += 1e-6
                        up = loss(*args)
                        args[which][idx] -= 2e-6
                        numeric[idx] = (up - loss(*args)) / 2e-6
                    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8,
                                               err_msg=f"{causal} {mode} {which}")


if __name__ == "__main__":
    unittest.main()
