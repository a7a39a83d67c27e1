#!/usr/bin/python3
"""End-to-end test of kiln-server and the `kiln` command-line tool.

Makes a tiny synthetic model with `kiln synth`, starts kiln-server on a free local port, and
checks the gRPC API (with grpcio and Python stubs generated here from the repository's protos)
and the `kiln` CLI against it. The server is always stopped at the end; the whole run is bounded
(about a minute at worst). Run by ctest as `e2e_python`; by hand:

  /usr/bin/python3 tests/e2e/test_server.py --server build/dev/server/kiln-server \
      --kiln build/dev/clients/kiln --proto-dir proto [--keep]

Needs Debian's python3-grpcio and python3-protobuf (scripts/setup.sh), protoc and
grpc_python_plugin.
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

RPC_TIMEOUT = 20  # seconds, each call
READY_TIMEOUT = 30  # seconds for the server's ready line
TOTAL_BUDGET = 55  # seconds; checks left when it runs out fail as "out of time"
ADMIN_TOKEN = "e2e-admin-token"
PROMPT_IDS = [1, 2, 3, 4, 5]

# Used when the repository has no proto/grpc/health/v1/health.proto.
HEALTH_PROTO = """syntax = "proto3";
package grpc.health.v1;
message HealthCheckRequest { string service = 1; }
message HealthCheckResponse {
  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
  ServingStatus status = 1;
}
service Health {
  rpc Check(HealthCheckRequest) returns (HealthCheckResponse);
  rpc Watch(HealthCheckRequest) returns (stream HealthCheckResponse);
}
"""


class Skip(Exception):
    """A check that does not apply to this build (e.g. the model has no tokenizer)."""


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def generate_stubs(proto_dir, out_dir):
    """Python stubs for kiln.v1 and grpc.health.v1, generated with protoc."""
    os.makedirs(out_dir)
    plugin = "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin"
    subprocess.run(["protoc", f"-I{proto_dir}", f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}", plugin, "kiln/v1/kiln.proto"],
                   check=True, timeout=60)
    # The health stubs get a module name of their own: a "grpc/" directory here would shadow
    # the grpc package.
    health_src = os.path.join(out_dir, "health_src")
    os.makedirs(health_src)
    repo_health = os.path.join(proto_dir, "grpc", "health", "v1", "health.proto")
    if os.path.exists(repo_health):
        shutil.copyfile(repo_health, os.path.join(health_src, "kiln_e2e_health.proto"))
    else:
        with open(os.path.join(health_src, "kiln_e2e_health.proto"), "w") as f:
            f.write(HEALTH_PROTO)
    subprocess.run(["protoc", f"-I{health_src}", f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}", plugin, "kiln_e2e_health.proto"],
                   check=True, timeout=60)
    sys.path.insert(0, out_dir)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """kiln-server in a child process; stdout is drained by a thread, stderr goes to a file."""

    def __init__(self, binary, args, log_path):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.process = subprocess.Popen([binary] + args, stdout=subprocess.PIPE,
                                        stderr=self.log, stdin=subprocess.DEVNULL)
        self.ready = threading.Event()
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            if line.startswith("kiln-server: ready on"):
                self.ready.set()

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.wait(0.1):
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"kiln-server exited with {self.process.returncode} "
                                   "before it was ready")
        raise RuntimeError(f"kiln-server printed no ready line within {timeout} s")

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL; returns (exit code, seconds it took to exit)."""
        if self.process.poll() is None:
            self.process.terminate()
        start = time.monotonic()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.log.close()
        return self.process.returncode, time.monotonic() - start

    def tail(self, lines=40):
        with open(self.log_path, "rb") as f:
            text = f.read().decode(errors="replace").splitlines()
        return "\n".join(self.lines[-10:] + text[-lines:])


class Checks:
    def __init__(self, deadline):
        self.deadline = deadline
        self.passed, self.failed, self.skipped = [], [], []

    def run(self, name, fn):
        if time.monotonic() > self.deadline:
            self.failed.append(name)
            print(f"FAIL {name}: out of time", flush=True)
            return
        start = time.monotonic()
        try:
            fn()
        except Skip as e:
            self.skipped.append(name)
            print(f"SKIP {name}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
            self.failed.append(name)
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            print(f"FAIL {name}: {detail}", flush=True)
            tb = traceback.extract_tb(e.__traceback__)
            if tb:
                print(f"     at line {tb[-1].lineno}: {tb[-1].line}", flush=True)
        else:
            self.passed.append(name)
            print(f"PASS {name} ({time.monotonic() - start:.2f} s)", flush=True)


class Test:
    def __init__(self, args, tmp, address, metrics_url=None):
        import grpc
        import kiln_e2e_health_pb2 as health_pb2
        import kiln_e2e_health_pb2_grpc as health_grpc
        from kiln.v1 import kiln_pb2 as pb
        from kiln.v1 import kiln_pb2_grpc as pb_grpc

        self.grpc, self.pb, self.health_pb2 = grpc, pb, health_pb2
        self.args, self.tmp, self.address = args, tmp, address
        self.metrics_url = metrics_url
        self.model_dir = os.path.join(tmp, "models", "m")
        self.token_file = os.path.join(tmp, "admin-token")
        self.channel = grpc.insecure_channel(address)
        self.inference = pb_grpc.InferenceStub(self.channel)
        self.models = pb_grpc.ModelsStub(self.channel)
        self.health = health_grpc.HealthStub(self.channel)
        self.admin = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
        self.has_tokenizer = os.path.exists(os.path.join(self.model_dir, "tokenizer.json"))
        with open(os.path.join(self.model_dir, "config.json")) as f:
            self.config = json.load(f)
        self.greedy_ids = None

    # ---- helpers ---------------------------------------------------------------------------

    def request(self, model="tiny", ids=PROMPT_IDS, prompt=None, max_tokens=8, ignore_eos=True,
                **kwargs):
        pb = self.pb
        request = pb.GenerateRequest(model=model, **kwargs)
        if prompt is not None:
            request.prompt = prompt
        elif ids is not None:
            request.prompt_token_ids.ids.extend(ids)
        request.stopping.max_tokens = max_tokens
        request.stopping.ignore_eos = ignore_eos
        return request

    def generate(self, request):
        """All responses of one Generate call."""
        return list(self.inference.Generate(request, timeout=RPC_TIMEOUT))

    def expect_code(self, code, call, *args, **kwargs):
        """The call (a unary call, or a streaming one, read to the end) fails with `code`."""
        try:
            result = call(*args, timeout=RPC_TIMEOUT, **kwargs)
            if hasattr(result, "__iter__") and not isinstance(result, (str, bytes)):
                list(result)
        except self.grpc.RpcError as e:
            expect(e.code() == code, f"expected {code.name}, got {e.code().name}: {e.details()}")
            return e.details() or ""
        raise AssertionError(f"expected {code.name}, but the call succeeded")

    def kiln(self, *args, expect_rc=0, timeout=RPC_TIMEOUT):
        """Runs the CLI; returns (stdout, stderr)."""
        command = [self.args.kiln] + list(args)
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if expect_rc is not None:
            ok = result.returncode == expect_rc if expect_rc >= 0 else result.returncode != 0
            expect(ok, f"`{' '.join(args)}` exited {result.returncode} (expected "
                       f"{'non-zero' if expect_rc < 0 else expect_rc})\nstdout: {result.stdout}"
                       f"\nstderr: {result.stderr}")
        return result.stdout, result.stderr

    def server_flag(self):
        return f"--server={self.address}"

    # ---- checks ----------------------------------------------------------------------------

    def health_serving(self):
        response = self.health.Check(self.health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT)
        expect(response.status == self.health_pb2.HealthCheckResponse.SERVING,
               f"health status {response.status}")

    def greedy_length(self):
        responses = self.generate(self.request(max_tokens=8))
        expect(responses, "no responses")
        ids = [i for r in responses for i in r.token_ids]
        expect(len(ids) == 8, f"{len(ids)} tokens, expected max_tokens = 8: {ids}")
        vocab = self.config.get("vocab_size", 1 << 30)
        expect(all(0 <= i < vocab for i in ids), f"token ids outside the vocabulary: {ids}")
        last = responses[-1]
        expect(last.finish_reason == self.pb.LENGTH,
               f"finish_reason {self.pb.FinishReason.Name(last.finish_reason)}, expected LENGTH")
        for r in responses[:-1]:
            expect(r.finish_reason == self.pb.FINISH_REASON_UNSPECIFIED,
                   "finish_reason set before the last response")
        expect(last.HasField("usage"), "last response has no usage")
        expect(last.usage.prompt_tokens == len(PROMPT_IDS),
               f"usage.prompt_tokens {last.usage.prompt_tokens}, expected {len(PROMPT_IDS)}")
        expect(last.usage.completion_tokens == 8,
               f"usage.completion_tokens {last.usage.completion_tokens}, expected 8")
        t = last.timings
        expect(t.total_seconds > 0 and 0 <= t.time_to_first_token_seconds <= t.total_seconds,
               f"timings {t}")
        self.greedy_ids = ids

    def greedy_deterministic(self):
        if self.greedy_ids is None:
            raise Skip("needs the greedy run")
        ids = [i for r in self.generate(self.request(max_tokens=8)) for i in r.token_ids]
        expect(ids == self.greedy_ids, f"greedy runs differ: {ids} vs {self.greedy_ids}")

    def eos_respected(self):
        responses = self.generate(self.request(max_tokens=16, ignore_eos=False))
        ids = [i for r in responses for i in r.token_ids]
        reason = responses[-1].finish_reason
        expect(reason in (self.pb.LENGTH, self.pb.EOS), f"finish_reason {reason}")
        expect(len(ids) <= 16, f"{len(ids)} tokens > max_tokens")
        expect(reason != self.pb.LENGTH or len(ids) == 16, "LENGTH before max_tokens")

    def seeded_sampling(self):
        def run():
            request = self.request(max_tokens=12)
            request.sampling.temperature = 1.0
            request.sampling.top_k = 50
            request.sampling.seed = 1234
            return [i for r in self.generate(request) for i in r.token_ids]

        first, second = run(), run()
        expect(len(first) == 12, f"{len(first)} tokens")
        expect(first == second, f"same seed, different tokens: {first} vs {second}")

    def logprobs(self):
        responses = self.generate(self.request(max_tokens=4, logprobs=3))
        ids = [i for r in responses for i in r.token_ids]
        entries = [lp for r in responses for lp in r.logprobs]
        expect(len(entries) == len(ids), f"{len(entries)} logprob entries for {len(ids)} tokens")
        for token, entry in zip(ids, entries):
            expect(entry.chosen.token_id == token, f"chosen {entry.chosen.token_id} != {token}")
            expect(entry.chosen.logprob <= 1e-4, f"logprob {entry.chosen.logprob} > 0")
            expect(len(entry.top) == 3, f"{len(entry.top)} top entries, expected 3")
            best = max(t.logprob for t in entry.top)
            expect(entry.chosen.logprob >= best - 1e-3,
                   f"greedy chose {entry.chosen.logprob}, top has {best}")

    def concurrent_greedy(self):
        if self.greedy_ids is None:
            raise Skip("needs the greedy run")
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(
                lambda _: [i for r in self.generate(self.request(max_tokens=8))
                           for i in r.token_ids], range(4)))
        for ids in runs:
            expect(ids == self.greedy_ids, f"concurrent greedy run differs: {ids} vs "
                                           f"{self.greedy_ids}")

    def cancel_then_serve(self):
        call = self.inference.Generate(self.request(max_tokens=1000), timeout=RPC_TIMEOUT)
        first = next(call)
        expect(len(first.token_ids) > 0, "first response has no tokens")
        call.cancel()
        self.health_serving()
        if self.greedy_ids is not None:
            self.greedy_deterministic()

    def text_prompt(self):
        if not self.has_tokenizer:
            raise Skip("the model has no tokenizer.json")
        text = "hello world, the kiln is hot"
        tokens = self.inference.Tokenize(self.pb.TokenizeRequest(model="tiny", text=text),
                                         timeout=RPC_TIMEOUT)
        expect(len(tokens.token_ids) > 0, "no token ids")
        expect(len(tokens.tokens) in (0, len(tokens.token_ids)), "tokens and ids differ in count")
        back = self.inference.Detokenize(
            self.pb.DetokenizeRequest(model="tiny", token_ids=tokens.token_ids),
            timeout=RPC_TIMEOUT)
        expect(back.text == text, f"detokenize(tokenize(x)) = {back.text!r}")
        responses = self.generate(self.request(prompt=text, max_tokens=6))
        last = responses[-1]
        expect(last.usage.prompt_tokens == len(tokens.token_ids),
               f"prompt_tokens {last.usage.prompt_tokens}, tokenize gave {len(tokens.token_ids)}")
        ids = [i for r in responses for i in r.token_ids]
        expect(len(ids) == 6, f"{len(ids)} tokens")
        streamed = "".join(r.text for r in responses)
        decoded = [self.inference.Detokenize(
            self.pb.DetokenizeRequest(model="tiny", token_ids=ids, skip_special_tokens=skip),
            timeout=RPC_TIMEOUT).text for skip in (False, True)]
        expect(streamed in decoded, f"streamed text {streamed!r}, detokenized {decoded!r}")
        # The same prompt as ids gives the same tokens.
        by_ids = self.generate(self.request(ids=list(tokens.token_ids), max_tokens=6))
        expect([i for r in by_ids for i in r.token_ids] == ids, "text and id prompts differ")

    def stop_string(self):
        if not self.has_tokenizer:
            raise Skip("the model has no tokenizer.json")
        responses = self.generate(self.request(max_tokens=24))
        text = "".join(r.text for r in responses)
        # A stop string of two printable ASCII characters from the middle of the output.
        candidates = [k for k in range(1, len(text) - 1)
                      if text[k:k + 2].isascii() and text[k:k + 2].isprintable()]
        if not candidates:
            raise Skip(f"no ASCII pair in the greedy text {text!r}")
        stop = text[candidates[len(candidates) // 2]:][:2]
        expected = text[:text.find(stop)]
        request = self.request(max_tokens=24)
        request.stopping.stop.append(stop)
        responses = self.generate(request)
        got = "".join(r.text for r in responses)
        expect(responses[-1].finish_reason == self.pb.STOP,
               f"finish_reason {self.pb.FinishReason.Name(responses[-1].finish_reason)} "
               f"with stop {stop!r} in {text!r}")
        expect(got == expected, f"stop {stop!r}: got {got!r}, expected {expected!r}")

    def list_and_get(self):
        listed = self.models.ListModels(self.pb.ListModelsRequest(), metadata=self.admin,
                                        timeout=RPC_TIMEOUT)
        names = {m.name: m for m in listed.models}
        expect("tiny" in names, f"ListModels: {sorted(names)}")
        expect(names["tiny"].state == self.pb.READY, f"listed state {names['tiny'].state}")
        info = self.models.GetModel(self.pb.GetModelRequest(name="tiny"), metadata=self.admin,
                                    timeout=RPC_TIMEOUT)
        expect(info.state == self.pb.READY, f"state {self.pb.ModelState.Name(info.state)}")
        expect(len(info.load_report.placed) > 0, "load_report.placed is empty")
        expect(info.parameter_count > 0, "parameter_count 0")
        expect(info.bytes_in_memory > 0, "bytes_in_memory 0")
        expect(info.architecture, "no architecture")
        expect(info.dtype, "no dtype")
        # --kv-cache-dtype auto: the KV pool holds the model's compute dtype.
        expect(info.kv_pool.dtype == info.dtype, f"kv_pool.dtype {info.kv_pool.dtype!r}, "
               f"compute dtype {info.dtype!r}")
        expect(info.backend == "cpu" and info.backend_description,
               f"backend {info.backend!r} ({info.backend_description!r})")
        if "vocab_size" in self.config and info.vocab_size:
            expect(info.vocab_size == self.config["vocab_size"], f"vocab_size {info.vocab_size}")
        expect(not info.load_report.missing, f"missing tensors: {info.load_report.missing}")

    def load_unload(self):
        pb = self.pb
        info = self.models.LoadModel(pb.LoadModelRequest(name="tiny2", path=self.model_dir,
                                                         dtype="f32"),
                                     metadata=self.admin, timeout=RPC_TIMEOUT)
        expect(info.state == pb.READY, f"LoadModel state {pb.ModelState.Name(info.state)}")
        expect(info.kv_pool.dtype == "f32", f"an f32 model's KV pool is {info.kv_pool.dtype!r}")
        try:
            self.expect_code(self.grpc.StatusCode.ALREADY_EXISTS, self.models.LoadModel,
                             pb.LoadModelRequest(name="tiny2", path=self.model_dir),
                             metadata=self.admin)
            if self.greedy_ids is not None:
                request = self.request(model="tiny2", max_tokens=8)
                ids = [i for r in self.generate(request) for i in r.token_ids]
                expect(ids == self.greedy_ids, f"same weights, different tokens: {ids}")
        finally:
            self.models.UnloadModel(pb.UnloadModelRequest(name="tiny2"), metadata=self.admin,
                                    timeout=RPC_TIMEOUT)
        self.expect_code(self.grpc.StatusCode.NOT_FOUND, self.models.GetModel,
                         pb.GetModelRequest(name="tiny2"), metadata=self.admin)
        self.expect_code(self.grpc.StatusCode.NOT_FOUND, self.inference.Generate,
                         self.request(model="tiny2"))

    def errors(self):
        pb, codes = self.pb, self.grpc.StatusCode
        self.expect_code(codes.NOT_FOUND, self.inference.Generate, self.request(model="nope"))
        details = self.expect_code(codes.INVALID_ARGUMENT, self.inference.Generate,
                                   self.request(ids=None))
        expect("prompt" in details, f"INVALID_ARGUMENT does not name the prompt: {details!r}")
        self.expect_code(codes.INVALID_ARGUMENT, self.inference.Generate,
                         self.request(ids=[1, 1 << 30]))
        self.expect_code(codes.NOT_FOUND, self.models.GetModel, pb.GetModelRequest(name="nope"),
                         metadata=self.admin)
        self.expect_code(codes.NOT_FOUND, self.models.UnloadModel,
                         pb.UnloadModelRequest(name="nope"), metadata=self.admin)
        self.expect_code(codes.ALREADY_EXISTS, self.models.LoadModel,
                         pb.LoadModelRequest(name="tiny", path=self.model_dir),
                         metadata=self.admin)
        outside = os.path.join(self.tmp, "outside", "m")
        self.expect_code(codes.PERMISSION_DENIED, self.models.LoadModel,
                         pb.LoadModelRequest(name="evil", path=outside), metadata=self.admin)
        escape = os.path.join(self.tmp, "models", "..", "outside", "m")
        self.expect_code(codes.PERMISSION_DENIED, self.models.LoadModel,
                         pb.LoadModelRequest(name="evil", path=escape), metadata=self.admin)

    def admin_token(self):
        codes = self.grpc.StatusCode
        self.expect_code(codes.UNAUTHENTICATED, self.models.ListModels,
                         self.pb.ListModelsRequest())
        try:
            self.models.ListModels(self.pb.ListModelsRequest(),
                                   metadata=(("authorization", "Bearer wrong"),),
                                   timeout=RPC_TIMEOUT)
        except self.grpc.RpcError as e:
            expect(e.code() in (codes.UNAUTHENTICATED, codes.PERMISSION_DENIED),
                   f"wrong token: {e.code().name}")
        else:
            raise AssertionError("a wrong admin token was accepted")
        # Inference needs no token.
        self.generate(self.request(max_tokens=1))

    def metrics(self):
        """GET /metrics (--metrics-listen) moves with a Generate call; other paths are 404."""
        if self.metrics_url is None:
            raise Skip("the ready line names no metrics endpoint")

        def scrape():
            with urllib.request.urlopen(self.metrics_url, timeout=RPC_TIMEOUT) as reply:
                expect(reply.status == 200, f"GET /metrics: HTTP {reply.status}")
                kind = reply.headers.get("Content-Type", "")
                expect(kind.startswith("text/plain"), f"Content-Type {kind!r}")
                return reply.read().decode()

        def value(text, series):
            for line in text.splitlines():
                if line.startswith(series + " "):
                    return float(line.rsplit(" ", 1)[1])
            return 0.0

        ok = 'kiln_requests_total{model="tiny",code="OK",finish_reason="length",protocol="grpc"}'
        tokens = 'kiln_generation_tokens_total{model="tiny"}'
        ttft = 'kiln_time_to_first_token_seconds_count{model="tiny"}'
        before = scrape()
        self.generate(self.request(max_tokens=4))
        after = scrape()
        expect(value(after, ok) == value(before, ok) + 1, f"{ok}: {value(after, ok)}")
        expect(value(after, tokens) == value(before, tokens) + 4,
               f"{tokens}: {value(after, tokens)}")
        expect(value(after, ttft) == value(before, ttft) + 1, f"{ttft}: {value(after, ttft)}")
        expect('kiln_models{state="READY"}' in after, "no kiln_models gauge")
        expect("# TYPE kiln_e2e_request_latency_seconds histogram" in after, "no e2e histogram")
        try:
            urllib.request.urlopen(self.metrics_url[:-len("/metrics")] + "/nope",
                                   timeout=RPC_TIMEOUT)
        except urllib.error.HTTPError as e:
            expect(e.code == 404, f"GET /nope: HTTP {e.code}")
        else:
            raise AssertionError("GET /nope succeeded")

    # ---- the CLI ---------------------------------------------------------------------------

    def cli_health(self):
        out, _ = self.kiln("health", self.server_flag(), "--timeout=10")
        expect(out.strip() == "SERVING", f"stdout {out!r}")

    def cli_health_unreachable(self):
        _, err = self.kiln("health", f"--server=127.0.0.1:{free_port()}", "--timeout=5",
                           expect_rc=3)
        expect("UNAVAILABLE" in err, f"stderr {err!r}")

    def cli_generate(self):
        out, err = self.kiln("generate", self.server_flag(), "--model", "tiny",
                             "--prompt_ids", ",".join(map(str, PROMPT_IDS)), "--max_tokens", "8",
                             "--ignore-eos", "--ids")
        id_lines = [line for line in out.splitlines() if line.startswith("ids: ")]
        expect(len(id_lines) == 1, f"no ids line in {out!r}")
        ids = [int(i) for i in id_lines[0][5:].split(",") if i]
        expect(len(ids) == 8, f"{len(ids)} ids")
        if self.greedy_ids is not None:
            expect(ids == self.greedy_ids, f"CLI ids {ids} vs {self.greedy_ids}")
        expect("finish_reason=LENGTH" in err, f"stderr {err!r}")
        expect("completion_tokens=8" in err, f"stderr {err!r}")
        expect("ttft_ms=" in err and "tokens_per_s=" in err, f"stderr {err!r}")
        if self.has_tokenizer:
            text = "".join(r.text for r in self.generate(self.request(max_tokens=8)))
            expect(out.startswith(text), f"CLI text {out!r}, API text {text!r}")

    def cli_generate_text(self):
        if not self.has_tokenizer:
            raise Skip("the model has no tokenizer.json")
        prompt = "the kiln"
        out, err = self.kiln("generate", self.server_flag(), "--model=tiny", "--prompt", prompt,
                             "--max-tokens=5", "--ignore_eos", "--logprobs=2")
        api = "".join(r.text for r in self.generate(self.request(prompt=prompt, max_tokens=5)))
        expect(out == api, f"CLI printed {out!r}, the API streamed {api!r}")
        expect("logprobs:" in err and "[4]" in err, f"stderr {err!r}")

    def cli_tokenize(self):
        if not self.has_tokenizer:
            raise Skip("the model has no tokenizer.json")
        out, _ = self.kiln("tokenize", self.server_flag(), "--model=tiny", "--text=hello world")
        api = self.inference.Tokenize(self.pb.TokenizeRequest(model="tiny", text="hello world"),
                                      timeout=RPC_TIMEOUT)
        expect(f"ids: {','.join(map(str, api.token_ids))}" in out, f"stdout {out!r}")

    def cli_models(self):
        token = f"--admin-token-file={self.token_file}"
        out, _ = self.kiln("models", "get", "tiny", self.server_flag(), token)
        for word in ("READY", "architecture", "parameters", "memory", "loader", "load report",
                     "placed"):
            expect(word in out, f"`models get` lacks {word!r}: {out!r}")
        out, _ = self.kiln("models", "get", "tiny", "--json", self.server_flag(), token)
        info = json.loads(out)
        expect(info.get("state") == "READY" and info.get("name") == "tiny", f"JSON {info}")
        expect(len(info.get("load_report", {}).get("placed", [])) > 0, "JSON has no placed")
        out, _ = self.kiln("models", "list", self.server_flag(), f"--admin-token={ADMIN_TOKEN}")
        expect("tiny" in out and "READY" in out, f"`models list`: {out!r}")
        out, _ = self.kiln("models", "load", "tiny3", self.model_dir, "--dtype=f32",
                           "--kv_cache_dtype=bf16", "--backend=cpu", self.server_flag(), token)
        expect("READY" in out and "backend" in out, f"`models load`: {out!r}")
        expect(re.search(r"KV pool .* of bf16, ", out), f"`models load` KV pool: {out!r}")
        out, _ = self.kiln("models", "unload", "tiny3", self.server_flag(), token)
        expect("tiny3" in out, f"`models unload`: {out!r}")
        # --chat_template sends the file's text: one that does not parse fails that load.
        bad_template = os.path.join(self.tmp, "bad.jinja")
        with open(bad_template, "w") as f:
            f.write("{% for m in messages %}{{ m.content }}")
        out, err = self.kiln("models", "load", "tiny4", self.model_dir,
                             f"--chat_template={bad_template}", self.server_flag(), token,
                             expect_rc=-1)
        expect("chat template" in out + err, f"`models load --chat_template`: {out!r} {err!r}")

    def cli_tensorize(self):
        # `kiln tensorize` (local) writes a native file that the server loads on its own; the
        # Tensorize RPC (`kiln models tensorize`) writes one from the loaded model.
        token = f"--admin-token-file={self.token_file}"
        local = os.path.join(self.tmp, "models", "native-local.tensors")
        out, _ = self.kiln("tensorize", f"--model={self.model_dir}", f"--out={local}")
        expect("engine layout" in out and os.path.getsize(local) > 0, f"`tensorize`: {out!r}")
        remote = os.path.join(self.tmp, "models", "native-rpc.tensors")
        out, _ = self.kiln("models", "tensorize", "tiny", remote, self.server_flag(), token)
        expect(os.path.exists(remote), f"`models tensorize`: {out!r}")
        # --prepack: the linears as the server packed them, adopted by the load.
        prepacked = os.path.join(self.tmp, "models", "native-rpc-prepacked.tensors")
        out, _ = self.kiln("models", "tensorize", "tiny", prepacked, "--prepack",
                           self.server_flag(), token)
        expect("packed)" in out, f"`models tensorize --prepack`: {out!r}")
        for name, path in (("native-local", local), ("native-rpc", remote),
                           ("native-rpc-prepacked", prepacked)):
            out, _ = self.kiln("models", "load", name, path, self.server_flag(), token)
            expect("READY" in out and "tensorizer" in out, f"`models load {path}`: {out!r}")
            if name == "native-rpc-prepacked":
                out, _ = self.kiln("models", "get", name, self.server_flag(), token)
                expect("linears adopted from the file" in out, f"`models get {name}`: {out!r}")
            try:
                if self.greedy_ids is not None:
                    ids = [i for r in self.generate(self.request(model=name, max_tokens=8))
                           for i in r.token_ids]
                    expect(ids == self.greedy_ids, f"{name}: same weights, other tokens {ids}")
            finally:
                self.kiln("models", "unload", name, self.server_flag(), token)
        _, err = self.kiln("models", "tensorize", "tiny", remote, self.server_flag(), token,
                           expect_rc=1)
        expect("ALREADY_EXISTS" in err, f"stderr {err!r}")

    def cli_perplexity(self):
        # `kiln perplexity` on the trained default model (checkpoints/kiln-brown) and the first
        # held-out windows: the training script's evaluation of the same text within 0.5 %.
        repo = os.path.dirname(os.path.abspath(self.args.proto_dir))
        data = os.path.join(repo, "tests", "data", "kiln-brown")
        with open(os.path.join(data, "heldout_reference.json"), encoding="utf-8") as f:
            reference = json.load(f)
        model = f"--model={os.path.join(repo, 'checkpoints', 'kiln-brown')}"
        out, _ = self.kiln("perplexity", model, f"--text_file={os.path.join(data, 'heldout.txt')}",
                           f"--max_windows={reference['windows']}", "--json")
        got = json.loads(out)
        expect(got["windows"] == reference["windows"], f"windows: {got!r}")
        for key in ("perplexity", "mtp_perplexity"):
            ratio = got[key] / reference[key]
            expect(abs(ratio - 1) < 0.005, f"{key}: kiln {got[key]}, script {reference[key]}")
        # `kiln tensorize` of the same checkpoint: the file alone (tokenizer inside) gives the
        # same numbers, MTP head included.
        native = os.path.join(self.tmp, "kiln-brown.tensors")
        self.kiln("tensorize", model, f"--out={native}")
        out, _ = self.kiln("perplexity", f"--model={native}",
                           f"--text_file={os.path.join(data, 'heldout.txt')}",
                           f"--max_windows={reference['windows']}", "--json")
        tensorized = json.loads(out)
        expect(tensorized["perplexity"] == got["perplexity"] and
               tensorized["mtp_perplexity"] == got["mtp_perplexity"],
               f"tensorized {tensorized!r} != safetensors {got!r}")
        _, err = self.kiln("perplexity", model, "--text_file=/nonexistent/heldout.txt",
                           expect_rc=1)
        expect("cannot read /nonexistent/heldout.txt" in err, f"stderr {err!r}")
        _, err = self.kiln("perplexity", model, f"--text_file={self.token_file}", expect_rc=1)
        expect("at least 514 tokens" in err, f"stderr {err!r}")

    def cli_errors(self):
        _, err = self.kiln("generate", self.server_flag(), "--model=nope", "--prompt_ids=1,2",
                           expect_rc=1)
        expect("NOT_FOUND" in err and "nope" in err, f"stderr {err!r}")
        expect("Traceback" not in err and "terminate" not in err, f"stderr {err!r}")
        _, err = self.kiln("models", "get", "tiny", self.server_flag(), expect_rc=1)
        expect("UNAUTHENTICATED" in err, f"stderr {err!r}")
        _, err = self.kiln("models", "load", "tiny", self.model_dir, self.server_flag(),
                           f"--admin-token={ADMIN_TOKEN}", expect_rc=1)
        expect("ALREADY_EXISTS" in err, f"stderr {err!r}")
        _, err = self.kiln("generate", self.server_flag(), "--model=tiny", expect_rc=2)
        expect("--prompt" in err, f"usage error {err!r}")
        _, err = self.kiln("models", "load", "tiny5", self.model_dir, "--kv_cache_dtype=fp8",
                           self.server_flag(), f"--admin-token={ADMIN_TOKEN}", expect_rc=2)
        expect("kv_cache_dtype" in err and "fp8" in err, f"usage error {err!r}")
        out, _ = self.kiln("generate", "--help")
        expect("--max_tokens" in out and "--server" in out, f"help {out!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True, help="the kiln-server binary")
    parser.add_argument("--kiln", required=True, help="the kiln CLI binary")
    parser.add_argument("--proto-dir", required=True, help="the repository's proto/ directory")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    start = time.monotonic()

    tmp = tempfile.mkdtemp(prefix="kiln-e2e-")
    server = None
    checks = Checks(start + TOTAL_BUDGET)
    try:
        generate_stubs(args.proto_dir, os.path.join(tmp, "gen"))
        model_dir = os.path.join(tmp, "models", "m")
        subprocess.run([args.kiln, "synth", "--preset=kiln-tiny", "--dtype=f32",
                        f"--out={model_dir}"], check=True, timeout=60, stdout=subprocess.DEVNULL)
        # The same model outside the model root, for the PERMISSION_DENIED check.
        shutil.copytree(model_dir, os.path.join(tmp, "outside", "m"))
        with open(os.path.join(tmp, "admin-token"), "w") as f:
            f.write(ADMIN_TOKEN + "\n")
        address = f"127.0.0.1:{free_port()}"
        server = Server(args.server, [
            "--listen", address, "--model-root", os.path.join(tmp, "models"),
            "--model", f"tiny={model_dir}", "--admin-token-file", os.path.join(tmp, "admin-token"),
            "--metrics-listen", "127.0.0.1:0", "--kv-cache-dtype", "auto",
        ], os.path.join(tmp, "server.log"))
        server.wait_ready(READY_TIMEOUT)
        ready = next(line for line in server.lines if line.startswith("kiln-server: ready on"))
        metrics_url = None
        if "; metrics on " in ready:
            metrics_url = ready.split("; metrics on ", 1)[1].split()[0]
        print(f"e2e: kiln-server ready on {address} after {time.monotonic() - start:.1f} s "
              f"(tokenizer: {os.path.exists(os.path.join(model_dir, 'tokenizer.json'))})",
              flush=True)

        t = Test(args, tmp, address, metrics_url)
        for name in ("health_serving", "greedy_length", "greedy_deterministic", "eos_respected",
                     "seeded_sampling", "logprobs", "concurrent_greedy", "text_prompt",
                     "stop_string", "list_and_get", "load_unload", "errors", "admin_token",
                     "metrics", "cancel_then_serve", "cli_health", "cli_health_unreachable",
                     "cli_generate", "cli_generate_text", "cli_tokenize", "cli_models",
                     "cli_tensorize", "cli_perplexity", "cli_errors"):
            checks.run(name, getattr(t, name))
        t.channel.close()
    except Exception as e:  # noqa: BLE001 - setup failed: report it, stop the server
        checks.failed.append("setup")
        print(f"FAIL setup: {e}", flush=True)
        traceback.print_exc()
    finally:
        if server is not None:
            code, seconds = server.stop()
            if seconds > 5:
                checks.failed.append("shutdown")
                print(f"FAIL shutdown: kiln-server took {seconds:.1f} s to exit on SIGTERM")
            if checks.failed:
                print(f"---- kiln-server output (exit {code}) ----\n{server.tail()}\n----")
        if args.keep:
            print(f"e2e: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"e2e: {len(checks.passed)} passed, {len(checks.failed)} failed"
          + (f", {len(checks.skipped)} skipped" if checks.skipped else "")
          + f" in {time.monotonic() - start:.1f} s", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
