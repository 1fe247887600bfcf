"""End-to-end tests of the Python client (python/dattn_client) against the real binaries, whose
paths the wrapper (python/client_test.sh) passes in the environment: a coordinator started
--insecure with two CPU workers (Attend at 1 and 2 ranks against the float64 reference of
python/tests/reference.py, jobs), and a coordinator with TLS and bearer tokens (the connection
settings, as the CLI's)."""

import hashlib
import os
import re
import secrets
import subprocess
import tempfile
import time
import unittest
from unittest import mock

import numpy as np

import dattn_client
import reference
from dattn.v1 import job_pb2


class Daemons:
    """Processes started by a test, each with its log in `dir`; stopped (SIGTERM, then SIGKILL
    after 10 s) by stop()."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="py-", dir=os.environ.get("TEST_TMPDIR"))
        self.procs = []

    def start(self, name, argv):
        log = open(os.path.join(self.dir, f"{name}.log"), "w+")
        self.procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log))
        return log

    def coordinator(self, *flags):
        log = self.start("coordinator", [
            os.environ["DATTN_COORDINATOR_BIN"], "--listen", "127.0.0.1:0",
            "--metrics-listen", "127.0.0.1:0", "--data-dir", os.path.join(self.dir, "data"),
            "--heartbeat-ms", "300", *flags])
        for _ in range(300):
            log.seek(0)
            m = re.search(r"listening on (\S+), metrics", log.read())
            if m:
                return m.group(1)
            if self.procs[-1][0].poll() is not None:
                break
            time.sleep(0.1)
        log.seek(0)
        raise RuntimeError(f"the coordinator did not start:\n{log.read()}")

    def stop(self):
        for p, _ in self.procs:
            p.terminate()
        for p, log in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()

    def logs(self):
        text = []
        for p, log in self.procs:
            log.seek(0)
            text.append(f"== {log.name} ==\n" + "".join(log.readlines()[-20:]))
        return "\n".join(text)


class ClusterTest(unittest.TestCase):
    """A real coordinator (--insecure) and two CPU workers."""

    @classmethod
    def setUpClass(cls):
        cls.daemons = Daemons()
        try:
            address = cls.daemons.coordinator("--insecure", "--attend-shared-memory")
            for i in range(2):
                cls.daemons.start(f"worker-{i}", [
                    os.environ["DATTN_WORKER_BIN"], "--insecure", "--coordinator", address,
                    "--name", f"py-{i}", "--threads", "1", "--health-port", "0"])
            cls.client = dattn_client.Client(address, insecure=True)
            # Both workers registered (a 2-rank call fails at once until they are).
            deadline = time.time() + 60
            while True:
                try:
                    q = np.zeros((1, 4, 1, 2), np.float32)
                    cls.client.attend(q, q, q, [4], [1], num_ranks=2, timeout=10)
                    break
                except dattn_client.DattnError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
        except BaseException:
            print(cls.daemons.logs())
            cls.daemons.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemons.stop()

    def run(self, result=None):
        failures = len(result.failures) + len(result.errors) if result else 0
        outcome = super().run(result)
        if result and len(result.failures) + len(result.errors) > failures:
            print(self.daemons.logs())
        return outcome

    def inputs(self, seed, count, dtype=np.float64, shape=(2, 32, 4, 8)):
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(shape).astype(dtype) for _ in range(count)]

    def test_attend_at_one_and_two_ranks_equals_the_reference(self):
        # Two patterns, grouped and mixture, causal and not, fp64 (to 1e-10) and fp32 (to fp32's
        # accumulation error).
        seed = 0
        for ranks in (1, 2):
            for mode in ("grouped", "mixture"):
                for causal in (False, True):
                    for dtype, tol in ((np.float64, 1e-10), (np.float32, 2e-5)):
                        seed += 1
                        q, k, v = self.inputs(seed, 3, dtype)
                        what = f"ranks {ranks}, {mode}, causal {causal}, {np.dtype(dtype)}"
                        out = self.client.attend(q, k, v, [8, 16], [1, 2], causal=causal,
                                                 mode=mode, num_ranks=ranks, device="cpu",
                                                 timeout=60)
                        self.assertEqual(out.dtype, dtype, what)
                        want = reference.attention(q, k, v, [8, 16], [1, 2], causal=causal,
                                                   mode=mode)
                        np.testing.assert_allclose(out, want, rtol=tol, atol=tol, err_msg=what)
                        info = self.client.last_attend
                        self.assertEqual(info.num_ranks, ranks, what)
                        self.assertEqual(len(info.result.ranks), ranks, what)
                        self.assertEqual(self.client.get_job(info.job_id).state,
                                         job_pb2.JOB_STATE_SUCCEEDED, what)

    def test_attend_backward_at_one_and_two_ranks_equals_the_reference(self):
        seed = 100
        for ranks in (1, 2):
            for mode in ("grouped", "mixture"):
                for causal in (False, True):
                    for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
                        seed += 1
                        q, k, v, dout = self.inputs(seed, 4, dtype)
                        what = f"ranks {ranks}, {mode}, causal {causal}, {np.dtype(dtype)}"
                        got = self.client.attend_backward(
                            q, k, v, dout, [8, 16], [1, 2], causal=causal, mode=mode,
                            num_ranks=ranks, device="cpu", timeout=60)
                        want = reference.attention(q, k, v, [8, 16], [1, 2], causal=causal,
                                                   mode=mode, dout=dout)
                        for name, g, w in zip(["out", "dq", "dk", "dv"], got, want):
                            self.assertEqual(g.dtype, dtype, f"{what}: {name}")
                            np.testing.assert_allclose(g, w, rtol=tol, atol=tol,
                                                       err_msg=f"{what}: {name}")
                        self.assertEqual(self.client.last_attend.num_ranks, ranks, what)

    def test_shared_memory_at_one_and_two_ranks_equals_the_reference(self):
        # The tensors through a shared-memory region instead of the stream; the region is gone
        # afterwards.
        seed = 300
        for ranks in (1, 2):
            for backward in (False, True):
                seed += 1
                q, k, v, dout = self.inputs(seed, 4)
                what = f"ranks {ranks}, backward {backward}"
                if backward:
                    got = self.client.attend_backward(q, k, v, dout, [8, 16], [1, 2], causal=True,
                                                      num_ranks=ranks, device="cpu", timeout=60,
                                                      shared_memory=True)
                    want = reference.attention(q, k, v, [8, 16], [1, 2], causal=True, dout=dout)
                else:
                    got = [self.client.attend(q, k, v, [8, 16], [1, 2], causal=True,
                                              num_ranks=ranks, device="cpu", timeout=60,
                                              shared_memory=True)]
                    want = [reference.attention(q, k, v, [8, 16], [1, 2], causal=True)]
                for name, g, w in zip(["out", "dq", "dk", "dv"], got, want):
                    np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10,
                                               err_msg=f"{what}: {name}")
                self.assertEqual(self.client.last_attend.num_ranks, ranks, what)
        self.assertEqual([f for f in os.listdir("/dev/shm") if f.startswith("dattn-py-")], [])

    def test_a_tensor_of_several_chunks_at_two_ranks(self):
        # 6 MiB a tensor: two chunks each way, cut at a rank boundary by the coordinator.
        q, k, v = self.inputs(200, 3, np.float32, shape=(1, 4096, 3, 128))
        out = self.client.attend(q, k, v, [64], [1], num_ranks=2, device="cpu", timeout=120)
        want = reference.attention(q[:, :256], k[:, :256], v[:, :256], [64], [1])
        np.testing.assert_allclose(out[:, :256], want, rtol=2e-5, atol=2e-5)
        tail = reference.attention(q[:, -256:], k[:, -256:], v[:, -256:], [64], [1])
        np.testing.assert_allclose(out[:, -256:], tail, rtol=2e-5, atol=2e-5)

    def test_bad_calls_raise_with_the_coordinators_message(self):
        q = np.zeros((1, 9, 2, 4))
        with self.assertRaises(dattn_client.InvalidArgument) as e:
            self.client.attend(q, q, q, [4], [1], num_ranks=2)
        self.assertIn("start.num_ranks", e.exception.details)
        with self.assertRaises(dattn_client.NotFound):
            self.client.get_job("j-0000000000000000")
        with self.assertRaises(dattn_client.NotFound):
            list(self.client.watch("j-0000000000000000"))

    def test_submit_watch_to_succeeded_and_read_output(self):
        job = self.client.submit_attention(
            64, 2, 8, [16, 32], [1, 2], dtype="fp32", causal=True, num_ranks=2, device="cpu",
            seed=3, return_output=True, name="py-e2e", idempotency_key="py-submit")
        self.assertEqual(job.spec.name, "py-e2e")
        kinds = [e.kind for e in self.client.watch(job.job_id, timeout=60)]
        self.assertEqual(kinds[0], "submitted")
        self.assertEqual(kinds[-1], "succeeded")
        final = self.client.get_job(job.job_id)
        self.assertEqual(final.state, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertTrue(dattn_client.is_terminal(final.state))
        out = self.client.read_output(job.job_id)
        self.assertEqual(out.shape, (1, 64, 2, 8))
        self.assertEqual(out.dtype, np.float32)
        self.assertTrue(np.isfinite(out).all())
        # The job's fp64 checksum of its output is the sum of what read_output returned.
        result = final.result.attention
        self.assertEqual(list(result.output_info.shape), [1, 64, 2, 8])
        self.assertAlmostEqual(float(out.astype(np.float64).sum()), result.out_sum,
                               delta=1e-9 * max(1.0, abs(result.out_sum)))
        # The same key and spec: the same job; the job is listed.
        again = self.client.submit(job.spec, idempotency_key="py-submit")
        self.assertEqual(again.job_id, job.job_id)
        self.assertIn(job.job_id, [j.job_id for j in self.client.list_jobs()])
        # A dict in JSON form works the same.
        other = self.client.submit({"attention": {
            "attention": {"segmentLengths": [16], "dilationRates": [1]},
            "shape": {"batch": 1, "seqLen": 32, "numHeads": 1, "headDim": 4},
            "dtype": "DTYPE_FP64", "device": "DEVICE_PREFERENCE_CPU", "numRanks": 1}})
        self.assertEqual(self.client.wait(other.job_id, timeout=60).state,
                         job_pb2.JOB_STATE_SUCCEEDED)

    def test_cancel_ends_a_job_cancelled(self):
        job = self.client.submit_attention(4096, 4, 64, [512], [1], num_ranks=1, device="cpu",
                                           iterations=100000, priority=-100)
        self.client.cancel(job.job_id, reason="py test")
        final = self.client.wait(job.job_id, timeout=60)
        self.assertEqual(final.state, job_pb2.JOB_STATE_CANCELLED)
        self.assertIn(job.job_id, [j.job_id for j in self.client.list_jobs(
            states=[job_pb2.JOB_STATE_CANCELLED])])

    def test_health(self):
        self.assertEqual(self.client.health(), "SERVING")

    def test_deploy_generate_score_and_undeploy(self):
        # A tiny byte-level model trained for 3 steps by dattn-train: its final checkpoint.
        out = os.path.join(self.daemons.dir, "tiny-run")
        text = os.path.join(self.daemons.dir, "tiny.txt")
        with open(text, "w") as f:
            f.write("In the beginning God created the heaven and the earth.\n" * 200)
        config = os.path.join(self.daemons.dir, "tiny.json")
        with open(config, "w") as f:
            f.write("""{"model": {"vocab_size": 256, "d_model": 16, "num_layers": 1,
                         "num_heads": 2, "ffn_dim": 32,
                         "attention": {"segment_lengths": [8, 16], "dilation_rates": [1, 2]}},
                         "threads": 1, "seq_len": 32, "batch_size": 2, "steps": 3,
                         "optimizer": {"warmup_steps": 1},
                         "eval": {"every": 0}, "retrieval": {"examples": 0},
                         "checkpoint": {"every": 3, "keep_last": 1}, "log_every": 1}""")
        trained = subprocess.run([os.environ["DATTN_TRAIN_BIN"], "--data", text, "--out", out,
                                  "--config", config], capture_output=True, text=True)
        self.assertEqual(trained.returncode, 0, trained.stderr)
        checkpoint = os.path.join(out, "checkpoints", "step-00000003")
        with self.assertRaises(ValueError) as bad:
            self.client.deploy(checkpoint, device="tpu")
        self.assertIn("tpu", str(bad.exception))
        job = self.client.deploy(checkpoint, max_context=128, device="cpu", wait=60)
        self.assertEqual(job.spec.deployment.device, job_pb2.DEVICE_PREFERENCE_CPU)
        self.assertTrue(job.progress.deployment.ready)
        self.assertEqual(job.progress.deployment.checkpoint_step, 3)
        self.assertEqual(job.progress.deployment.device, "cpu fp32")
        try:
            generation = self.client.generate(job.job_id, "In the", max_tokens=20)
            tokens = [t.token for t in generation]
            self.assertEqual(len(tokens), 20)
            self.assertEqual(generation.done.finish_reason, "length")
            self.assertEqual(generation.done.prompt_tokens, 6)
            self.assertTrue(generation.accepted.startswith(job.job_id + "/"))
            # Greedy is deterministic; a seeded sample too; ids work as text does.
            again = [t.token for t in self.client.generate(job.job_id, list(b"In the"),
                                                           max_tokens=20)]
            self.assertEqual(again, tokens)
            sampled = [[t.token for t in self.client.generate(
                job.job_id, "In the", max_tokens=20, temperature=1.0, seed=5)] for _ in range(2)]
            self.assertEqual(sampled[0], sampled[1])
            # A stop sequence from its own output ends the result before it.
            stop = bytes(tokens[10:12])
            stopped = self.client.generate(job.job_id, "In the", max_tokens=20, stop=[stop])
            cut = [t.token for t in stopped]
            self.assertEqual(stopped.done.finish_reason, "stop")
            self.assertEqual(cut, tokens[:bytes(tokens).find(stop)])
            # Breaking out of the iterator cancels the request; the deployment serves on.
            for _ in self.client.generate(job.job_id, "x", max_tokens=100):
                break
            scored = self.client.score(job.job_id, "In the beginning")
            self.assertEqual(len(scored.logprobs), 15)
            self.assertAlmostEqual(scored.loss, -sum(scored.logprobs) / 15, places=9)
            with self.assertRaises(dattn_client.InvalidArgument) as e:
                list(self.client.generate(job.job_id, [1, 999]))
            self.assertIn("999", str(e.exception))
            with self.assertRaises(dattn_client.NotFound):
                list(self.client.generate("j-0000000000000000", "x"))
            with self.assertRaises(ValueError):
                self.client.deploy()
            with self.assertRaises(ValueError):
                self.client.deploy(checkpoint, model="tiny")
        finally:
            self.client.cancel(job.job_id)
            self.assertEqual(self.client.wait(job.job_id, timeout=60).state,
                             job_pb2.JOB_STATE_CANCELLED)

        # The registry: the same checkpoint imported, deployed by name on a real worker (which
        # verifies the copy's checksums as it loads), generates the same tokens.
        registered = self.client.import_model("tiny", checkpoint, description="3 steps")
        self.assertEqual(registered.version, 1)
        self.assertEqual(registered.weights, "weights.safetensors, F32")
        self.assertTrue(os.path.exists(os.path.join(registered.folder, "SHA256SUMS")))
        self.assertFalse(os.path.exists(os.path.join(registered.folder, "optimizer.safetensors")))
        self.assertEqual([m.version for m in self.client.list_models("tiny")], [1])
        with self.assertRaises(dattn_client.InvalidArgument) as e:
            self.client.import_model("no/slash", checkpoint)
        self.assertIn("name:", str(e.exception))
        by_name = self.client.deploy(model="tiny", max_context=128, device="cpu", wait=60)
        try:
            self.assertEqual(by_name.spec.deployment.model_version, 1)
            self.assertEqual(by_name.spec.deployment.checkpoint, registered.folder)
            self.assertEqual([t.token for t in self.client.generate(by_name.job_id, "In the",
                                                                    max_tokens=20)], tokens)
            with self.assertRaises(dattn_client.FailedPrecondition) as e:
                self.client.delete_model("tiny")
            self.assertIn(by_name.job_id, str(e.exception))
        finally:
            self.client.cancel(by_name.job_id)
            self.assertEqual(self.client.wait(by_name.job_id, timeout=60).state,
                             job_pb2.JOB_STATE_CANCELLED)
        deleted = self.client.delete_model("tiny")
        self.assertEqual(list(deleted.versions), [1])
        self.assertFalse(os.path.exists(registered.folder))
        with self.assertRaises(dattn_client.NotFound):
            self.client.deploy(model="tiny")


class TlsTest(unittest.TestCase):
    """A coordinator with TLS (scripts/make-certs.sh) and a token file: the client's CA, token and
    environment settings, as the CLI's."""

    @classmethod
    def setUpClass(cls):
        cls.daemons = Daemons()
        certs = os.path.join(cls.daemons.dir, "certs")
        subprocess.run(["bash", os.environ["DATTN_MAKE_CERTS"], certs], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cls.ca = os.path.join(certs, "ca.pem")
        cls.token = "dattn_" + secrets.token_urlsafe(32)
        tokens = os.path.join(cls.daemons.dir, "tokens")
        with open(tokens, "w") as f:
            f.write(f"sha256:{hashlib.sha256(cls.token.encode()).hexdigest()} py user\n")
        try:
            cls.address = cls.daemons.coordinator(
                "--tls-ca", cls.ca, "--tls-cert", os.path.join(certs, "coordinator.pem"),
                "--tls-key", os.path.join(certs, "coordinator-key.pem"), "--token-file", tokens)
        except BaseException:
            cls.daemons.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.daemons.stop()

    def test_the_ca_and_token_open_the_job_service(self):
        with dattn_client.Client(self.address, ca=self.ca, token=self.token) as c:
            self.assertEqual(c.health(), "SERVING")
            self.assertEqual(c.list_jobs(), [])
            with self.assertRaises(dattn_client.NotFound):
                c.get_job("j-0000000000000000")
        env = {"DATTN_COORDINATOR": self.address, "DATTN_TLS_CA": self.ca,
               "DATTN_TOKEN": self.token + "\n"}
        with mock.patch.dict(os.environ, env):
            with dattn_client.Client() as c:
                self.assertTrue(c.tls)
                self.assertEqual(c.list_jobs(), [])

    def test_no_token_a_wrong_one_or_no_tls_fail_clearly(self):
        with dattn_client.Client(self.address, ca=self.ca, token="") as c:
            with self.assertRaises(dattn_client.Unauthenticated):
                c.list_jobs()
        with dattn_client.Client(self.address, ca=self.ca, token="dattn_wrong") as c:
            with self.assertRaises(dattn_client.Unauthenticated) as e:
                c.list_jobs()
            self.assertIn("not known", e.exception.details)
            q = np.zeros((1, 4, 1, 2), np.float32)
            with self.assertRaises(dattn_client.Unauthenticated):
                c.attend(q, q, q, [4], [1])
        with dattn_client.Client(self.address, insecure=True, timeout=5) as c:
            with self.assertRaises(dattn_client.Unavailable):
                c.list_jobs()


if __name__ == "__main__":
    unittest.main()
