"""Tests of the Python client (python/dattn_client): against an in-process fake JobService, and end
to end against a real coordinator and CPU workers (the binaries whose paths the test wrapper,
python/client_test.sh, passes in the environment)."""

import concurrent.futures
import importlib.util
import os
import re
import subprocess
import tempfile
import time
import unittest

import grpc
import numpy as np

import dattn_client
from dattn.v1 import attention_pb2, job_pb2, job_service_pb2, job_service_pb2_grpc


def plain_attention(q, k, v):
    """One pattern covering the sequence, rate 1, grouped, not causal: softmax(q k^T / sqrt(D)) v
    per batch row and head, in float64."""
    s = np.einsum("bnhd,bmhd->bhnm", q.astype(np.float64), k.astype(np.float64))
    s /= np.sqrt(q.shape[-1])
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhnm,bmhd->bnhd", p, v.astype(np.float64))


class FakeJobs(job_service_pb2_grpc.JobServiceServicer):
    """Attend as the coordinator answers it, for a single full-length pattern; records what the
    client sent; `fail` makes the next call end with that (code, details)."""

    def __init__(self):
        self.starts = []
        self.chunk_sizes = []
        self.fail = None

    def Attend(self, request_iterator, context):
        first = next(request_iterator)
        self.starts.append(first.start)
        if self.fail:
            code, details = self.fail
            self.fail = None
            context.abort(code, details)
        s = first.start
        shape = (s.shape.batch, s.shape.seq_len, s.shape.num_heads, s.shape.head_dim)
        dtype = {attention_pb2.DTYPE_FP32: np.float32, attention_pb2.DTYPE_FP64: np.float64}[s.dtype]
        count = 4 if s.backward else 3
        data = [bytearray() for _ in range(count)]
        for message in request_iterator:
            c = message.chunk
            t = c.tensor - attention_pb2.ATTEND_TENSOR_Q
            total = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if c.offset != len(data[t]) or (t > 0 and len(data[t - 1]) != total):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"chunk of {t} out of order")
            self.chunk_sizes.append(len(c.data))
            data[t] += c.data
        q, k, v = (np.frombuffer(bytes(d), dtype).reshape(shape) for d in data[:3])
        yield job_service_pb2.AttendResponse(
            accepted=job_service_pb2.AttendAccepted(job_id="j-fake", num_ranks=2))
        out = plain_attention(q, k, v).astype(dtype)
        outputs = [out] + ([q, k, v] if s.backward else [])  # Stand-ins for dq, dk, dv.
        for t, o in enumerate(outputs):
            raw = o.tobytes()
            for offset in range(0, len(raw), 1000):
                yield job_service_pb2.AttendResponse(chunk=attention_pb2.AttendChunk(
                    tensor=attention_pb2.ATTEND_TENSOR_OUT + t, offset=offset,
                    data=raw[offset:offset + 1000]))
        yield job_service_pb2.AttendResponse(done=job_pb2.AttentionJobResult(tflops=1.5))


class FakeServerTest(unittest.TestCase):
    def setUp(self):
        self.jobs = FakeJobs()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4),
                                  options=[("grpc.max_receive_message_length", 32 << 20)])
        job_service_pb2_grpc.add_JobServiceServicer_to_server(self.jobs, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.client = dattn_client.Client(f"127.0.0.1:{port}", ca="", token="")

    def tearDown(self):
        self.client.close()
        self.server.stop(None)

    def test_attend_sends_the_problem_and_assembles_the_output(self):
        rng = np.random.default_rng(1)
        q, k, v = (rng.standard_normal((2, 16, 3, 8)).astype(np.float32) for _ in range(3))
        out = self.client.attend(q, k, v, [16], [1], num_ranks=2, device="cpu", name="n")
        np.testing.assert_allclose(out, plain_attention(q, k, v), rtol=1e-5, atol=1e-6)
        start = self.jobs.starts[0]
        self.assertEqual(list(start.attention.segment_lengths), [16])
        self.assertEqual((start.shape.batch, start.shape.seq_len, start.shape.num_heads,
                          start.shape.head_dim), (2, 16, 3, 8))
        self.assertEqual(start.dtype, attention_pb2.DTYPE_FP32)
        self.assertEqual(start.num_ranks, 2)
        self.assertEqual(start.device, job_pb2.DEVICE_PREFERENCE_CPU)
        self.assertFalse(start.backward)
        self.assertEqual(self.client.last_attend.job_id, "j-fake")
        self.assertAlmostEqual(self.client.last_attend.result.tflops, 1.5)

    def test_backward_returns_four_arrays(self):
        rng = np.random.default_rng(2)
        q, k, v, dout = (rng.standard_normal((1, 8, 2, 4)) for _ in range(4))
        out, dq, dk, dv = self.client.attend_backward(q, k, v, dout, [8], [1], mode="mixture")
        self.assertTrue(self.jobs.starts[0].backward)
        self.assertEqual(self.jobs.starts[0].attention.mode, attention_pb2.ATTENTION_MODE_MIXTURE)
        np.testing.assert_array_equal(dq, q)  # The fake's stand-ins: what was sent comes back.
        np.testing.assert_array_equal(dv, v)

    def test_large_tensors_go_in_chunks_of_at_most_4_mib(self):
        q = np.zeros((1, 4096, 4, 96), np.float64)  # 12 MiB a tensor.
        self.client.attend(q, q, q, [64], [1])
        self.assertEqual(max(self.jobs.chunk_sizes), dattn_client.CHUNK_BYTES)
        self.assertEqual(sum(self.jobs.chunk_sizes), 3 * q.nbytes)

    def test_errors_are_exceptions_with_the_code_and_message(self):
        self.jobs.fail = (grpc.StatusCode.INVALID_ARGUMENT, "start.dtype: required")
        q = np.zeros((1, 8, 1, 4), np.float32)
        with self.assertRaises(dattn_client.InvalidArgument) as e:
            self.client.attend(q, q, q, [8], [1])
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("start.dtype: required", str(e.exception))
        self.jobs.fail = (grpc.StatusCode.RESOURCE_EXHAUSTED, "needs 9 GiB")
        with self.assertRaises(dattn_client.ResourceExhausted):
            self.client.attend(q, q, q, [8], [1])

    def test_bad_arrays_are_value_errors_before_anything_is_sent(self):
        q = np.zeros((1, 8, 1, 4), np.float32)
        with self.assertRaisesRegex(ValueError, "k: shape"):
            self.client.attend(q, np.zeros((1, 8, 2, 4), np.float32), q, [8], [1])
        with self.assertRaisesRegex(ValueError, "v: dtype float64"):
            self.client.attend(q, q, q.astype(np.float64), [8], [1])
        with self.assertRaisesRegex(ValueError, "q: a .B, N, H, D. array"):
            self.client.attend(q[0], q[0], q[0], [8], [1])
        with self.assertRaisesRegex(ValueError, "q: dtype int32"):
            self.client.attend(q.astype(np.int32), q, q, [8], [1])
        with self.assertRaisesRegex(ValueError, "one rate per segment length"):
            self.client.attend(q, q, q, [8, 16], [1])
        self.assertEqual(self.jobs.starts, [])

    def test_unreachable_coordinator_is_unavailable(self):
        client = dattn_client.Client("127.0.0.1:1", ca="", token="", timeout=2)
        with self.assertRaises(dattn_client.Unavailable):
            client.get_job("j-0")


def load_reference():
    """model/testing/longnet_reference.py: the numpy re-implementation of the engine's function."""
    spec = importlib.util.spec_from_file_location("longnet_reference",
                                                  os.environ["DATTN_REFERENCE_PY"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@unittest.skipUnless(os.environ.get("DATTN_COORDINATOR_BIN"), "needs the binaries (client_test.sh)")
class ClusterTest(unittest.TestCase):
    """A real coordinator (--insecure) and two CPU workers."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.procs = []
        cls.logs = []
        log = open(os.path.join(cls.dir, "coordinator.log"), "w+")
        cls.logs.append(log)
        cls.procs.append(subprocess.Popen(
            [os.environ["DATTN_COORDINATOR_BIN"], "--insecure", "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--data-dir", os.path.join(cls.dir, "data"),
             "--heartbeat-ms", "300"], stderr=log))
        address = None
        for _ in range(300):
            log.seek(0)
            m = re.search(r"listening on (\S+), metrics", log.read())
            if m:
                address = m.group(1)
                break
            time.sleep(0.1)
        assert address, "the coordinator did not start"
        for i in range(2):
            cls.logs.append(open(os.path.join(cls.dir, f"worker-{i}.log"), "w"))
            cls.procs.append(subprocess.Popen(
                [os.environ["DATTN_WORKER_BIN"], "--insecure", "--coordinator", address,
                 "--name", f"py-{i}", "--threads", "1", "--health-port", "0"],
                stderr=cls.logs[-1]))
        cls.client = dattn_client.Client(address, ca="", token="")
        cls.reference = load_reference()
        # Both workers registered (a 2-rank call queues until they are).
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                q = np.zeros((1, 4, 1, 2), np.float32)
                cls.client.attend(q, q, q, [4], [1], num_ranks=2, timeout=5)
                break
            except dattn_client.DattnError:
                time.sleep(0.2)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        for p in cls.procs:
            p.terminate()
        for p in cls.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in cls.logs:
            log.close()

    def inputs(self, seed, shape=(2, 32, 4, 8), count=3):
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(shape) for _ in range(count)]

    def test_attend_at_one_and_two_ranks_equals_the_numpy_reference(self):
        for ranks, mode in ((1, "grouped"), (2, "grouped"), (2, "mixture")):
            q, k, v = self.inputs(ranks)
            out = self.client.attend(q, k, v, [8, 16], [1, 2], causal=True, mode=mode,
                                     num_ranks=ranks, timeout=60)
            want = self.reference.dilated_attention(q, k, v, [8, 16], [1, 2], mode, "modulo")
            np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12, err_msg=f"{ranks} {mode}")
            self.assertEqual(self.client.last_attend.num_ranks, ranks)
            self.assertEqual(len(self.client.last_attend.result.ranks), ranks)

    def test_backward_equals_finite_differences_of_the_reference(self):
        q, k, v, dout = self.inputs(7, shape=(1, 8, 2, 4), count=4)
        seg, rates = [4, 8], [1, 2]
        out, dq, dk, dv = self.client.attend_backward(q, k, v, dout, seg, rates, causal=True,
                                                      num_ranks=2, timeout=60)

        def loss(qq, kk, vv):
            return float(np.sum(self.reference.dilated_attention(qq, kk, vv, seg, rates,
                                                                 "grouped", "modulo") * dout))
        eps = 1e-6
        for name, grad, which in (("dq", dq, 0), ("dk", dk, 1), ("dv", dv, 2)):
            numeric = np.zeros_like(grad)
            for idx in np.ndindex(grad.shape):
                args = [q.copy(), k.copy(), v.copy()]
                args[which][idx] += eps
                up = loss(*args)
                args[which][idx] -= 2 * eps
                numeric[idx] = (up - loss(*args)) / (2 * eps)
            np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7, err_msg=name)

    def test_bad_calls_raise_with_the_coordinators_message(self):
        q = np.zeros((1, 9, 2, 4))
        with self.assertRaises(dattn_client.InvalidArgument) as e:
            self.client.attend(q, q, q, [4], [1], num_ranks=2)
        self.assertIn("start.num_ranks", str(e.exception))

    def test_submit_watch_and_read_output(self):
        job = self.client.submit({"attention": {
            "attention": {"segmentLengths": [16], "dilationRates": [1]},
            "shape": {"batch": 1, "seqLen": 64, "numHeads": 2, "headDim": 8},
            "dtype": "DTYPE_FP32", "device": "DEVICE_PREFERENCE_CPU", "returnOutput": True, "numRanks": 1,
            "seed": 3}}, idempotency_key="py-submit")
        kinds = [e.kind for e in self.client.watch(job.job_id, timeout=60)]
        self.assertEqual(kinds[0], "submitted")
        self.assertEqual(kinds[-1], "succeeded")
        self.assertEqual(self.client.get_job(job.job_id).state, job_pb2.JOB_STATE_SUCCEEDED)
        out = self.client.read_output(job.job_id)
        self.assertEqual(out.shape, (1, 64, 2, 8))
        self.assertEqual(out.dtype, np.float32)
        self.assertTrue(np.isfinite(out).all())
        # The same key and spec: the same job.
        again = self.client.submit(job.spec, idempotency_key="py-submit")
        self.assertEqual(again.job_id, job.job_id)
        with self.assertRaises(dattn_client.NotFound):
            self.client.get_job("j-0000000000000000")


if __name__ == "__main__":
    unittest.main()
