#!/usr/bin/python3
"""Hostile-input end-to-end test of kiln-server.

Three parts, against kiln-server processes started here on free local ports:

1. Bad requests: every case of tests/data/bad-requests/ (README.md there describes the format)
   is sent over HTTP or gRPC and must be refused with its exact status and a message naming
   what is wrong; after each case the server must still serve a normal request. A case that
   kills the server fails, and the server is started again so that the remaining cases run.
2. Bad model files, made here from the tiny synthesized model inside the server's model root:
   each LoadModel fails with a clear error, the model loaded before keeps serving, and the
   server's peak memory (VmHWM) stays bounded.
3. SIGTERM drain: a stream that can finish within --shutdown-grace finishes; one that cannot
   ends with UNAVAILABLE "shutting down"; new requests are refused; the process exits 0.

Run by ctest as `e2e_hostile`; by hand:

  /usr/bin/python3 tests/e2e/test_hostile.py --server build/dev/server/kiln-server \
      --kiln build/dev/clients/kiln --proto-dir proto [--keep] [--only NAME-SUBSTRING]

Needs what tests/e2e/test_server.py needs (its helpers are imported from there).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server  # noqa: E402 - the helpers live beside this file
from test_server import ADMIN_TOKEN, Checks, Server, expect, free_port  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(REPO, "tests", "data", "bad-requests")
RPC_TIMEOUT = 20  # seconds, each call
READY_TIMEOUT = 30  # seconds for a server's ready line
TOTAL_BUDGET = 100  # seconds; checks left when it runs out fail as "out of time"
MEMORY_BOUND = 200 << 20  # bytes VmHWM may grow by over the bad-model part
HEALTHY_IDS = [1, 2, 3, 4, 5]

# Small limits, so that the corpus reaches each one with a small file. The corpus's cases are
# written against these values (tests/data/bad-requests/README.md).
MAX_CONTEXT = 512
LIMIT_FLAGS = [
    "--max-context", str(MAX_CONTEXT),
    "--max-stop-strings", "4",
    "--max-stop-string-bytes", "64",
    "--max-choices", "4",
    "--max-logprobs", "5",
    "--max-request-bytes", "131072",
    "--http-read-timeout", "1s",
]
SHUTDOWN_GRACE = 1.0  # seconds, the drain server's --shutdown-grace


# ---- the corpus -----------------------------------------------------------------------------

class Case:
    """One file of the corpus: what to send and what must come back."""

    def __init__(self, path, corpus):
        self.path = path
        self.name = os.path.relpath(path, corpus)
        self.protocol = "http" if path.endswith(".http") else "grpc"
        self.messages = []
        self.param = None  # HTTP: the OpenAI error's `param`, when the case names it
        self.headers = []  # (name, value), HTTP only
        self.raw = False
        self.method = self.target = None
        self.status = None  # HTTP status
        self.code = None  # gRPC status code name
        self.rpc = "Generate"
        self.text = None  # gRPC text format
        self.body = b""  # HTTP body, raw HTTP bytes, or serialized gRPC message
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".textproto"):
            self.text = data.decode("utf-8")
            self._directives([line[1:].strip() for line in self.text.splitlines()
                              if line.startswith("#")], notes=True)
        else:
            head, blank, self.body = data.partition(b"\n\n")
            expect(blank, f"{self.name}: no blank line ends the header lines")
            lines = head.decode("utf-8").split("\n")
            if path.endswith(".bin"):
                self._directives([line[1:].strip() for line in lines if line.startswith("#")],
                                 notes=True)
            else:
                lines = [line for line in lines if not line.startswith("#")]
                if lines[0] == "RAW":
                    self.raw = True
                else:
                    self.method, self.target = lines[0].split(" ", 1)
                self._directives(lines[1:], notes=False)
        if self.protocol == "http":
            expect(self.status is not None, f"{self.name}: no expect-status")
        else:
            expect(self.code is not None, f"{self.name}: no expect-code")
        expect(self.messages, f"{self.name}: no expect-message")

    def _directives(self, lines, notes):
        """`key: value` lines. With `notes` (comment lines of gRPC cases) a line is a directive
        only when its key is one; otherwise every line must be one, so that a misspelt key
        is an error rather than a check that silently does not happen."""
        for line in lines:
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "expect-status":
                self.status = int(value)
            elif key == "expect-code":
                self.code = value
            elif key == "expect-message":
                self.messages.append(value)
            elif key == "expect-param" and not notes:
                self.param = value
            elif key == "header" and not notes:
                name, _, header_value = value.partition(":")
                self.headers.append((name.strip(), header_value.strip()))
            elif key == "rpc" and notes:
                self.rpc = value
            else:
                expect(notes and not key.startswith("expect-"),
                       f"{self.name}: unknown directive {line!r}")


def load_corpus(corpus, only=None):
    cases = []
    for sub in ("http", "grpc"):
        folder = os.path.join(corpus, sub)
        for name in sorted(os.listdir(folder)):
            if name.endswith((".http", ".textproto", ".bin")):
                if only and only not in f"{sub}/{name}":
                    continue
                cases.append(Case(os.path.join(folder, name), corpus))
    return cases


# ---- HTTP over a plain socket (so that any bytes at all can be sent) -------------------------

def http_exchange(port, data, timeout=10):
    """Sends `data` on a new connection and reads until the server closes it; returns
    (status, headers, body) or raises with what happened instead."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413) and close before it read everything
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except ConnectionResetError:
            pass  # the answer, if any, is in the chunks read so far
        except socket.timeout:
            raise AssertionError(f"no answer within {timeout} s "
                                 f"(read {sum(map(len, chunks))} bytes)")
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    if not head:
        raise ConnectionAbortedError("the connection closed without an answer")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = dechunk(body)
    return status, headers, body


def dechunk(data):
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return out


def http_request(method, target, body=b"", headers=()):
    """The bytes of a request: Host, Content-Type (JSON), Content-Length and Connection: close,
    each replaced by a header of the same name in `headers`."""
    fields = {"host": ("Host", "127.0.0.1"), "content-type": ("Content-Type", "application/json"),
              "content-length": ("Content-Length", str(len(body))),
              "connection": ("Connection", "close")}
    for name, value in headers:
        fields[name.lower()] = (name, value)
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in
                                                        fields.values()) + "\r\n"
    return head.encode("latin-1") + body


def error_message(body):
    """The message of an OpenAI error body ({"error": {"message": ...}})."""
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"the body is not an OpenAI error object: {body[:300]!r}")


# ---- one kiln-server and its clients ----------------------------------------------------------

class Target:
    """A running kiln-server with a gRPC channel and an HTTP port."""

    def __init__(self, args, tmp, name, extra_flags):
        import grpc
        self.grpc = grpc
        self.args, self.tmp, self.name, self.extra_flags = args, tmp, name, extra_flags
        self.restarts = 0
        self.start()

    def start(self):
        grpc = self.grpc
        self.grpc_port = self.http_port = free_port()
        while self.http_port == self.grpc_port:
            self.http_port = free_port()
        log = os.path.join(self.tmp, f"{self.name}-{self.restarts}.log")
        self.server = Server(self.args.server, [
            "--listen", f"127.0.0.1:{self.grpc_port}",
            "--http-listen", f"127.0.0.1:{self.http_port}",
            "--model-root", os.path.join(self.tmp, "models"),
            "--model", f"tiny={os.path.join(self.tmp, 'models', 'm')}",
            "--admin-token-file", os.path.join(self.tmp, "admin-token"),
        ] + self.extra_flags, log)
        self.server.wait_ready(READY_TIMEOUT)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        identity = dict(request_serializer=None, response_deserializer=None)
        self.raw_rpcs = {
            "Generate": self.channel.unary_stream("/kiln.v1.Inference/Generate", **identity),
            "Tokenize": self.channel.unary_unary("/kiln.v1.Inference/Tokenize", **identity),
            "Detokenize": self.channel.unary_unary("/kiln.v1.Inference/Detokenize", **identity),
        }

    def restart(self):
        self.channel.close()
        self.server.stop()
        self.restarts += 1
        self.start()

    def alive(self):
        return self.server.process.poll() is None

    def pid(self):
        return self.server.process.pid

    def memory(self):
        """(VmRSS, VmHWM) in bytes, from /proc/<pid>/status."""
        values = {}
        with open(f"/proc/{self.pid()}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) * 1024
        return values["VmRSS"], values["VmHWM"]

    def stop(self):
        self.channel.close()
        return self.server.stop()


class Hostile:
    def __init__(self, tmp, target):
        import grpc
        from google.protobuf import text_format
        from kiln.v1 import kiln_pb2 as pb
        from kiln.v1 import kiln_pb2_grpc as pb_grpc

        self.grpc, self.pb, self.pb_grpc, self.text_format = grpc, pb, pb_grpc, text_format
        self.tmp, self.target = tmp, target
        self.admin = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
        self.model_dir = os.path.join(tmp, "models", "m")
        self.baseline = None
        self.deaths = []  # cases after which the server was gone

    # ---- normal requests ---------------------------------------------------------------------

    def healthy_grpc(self):
        """A short greedy Generate gives the same 4 tokens as the first one did."""
        stub = self.pb_grpc.InferenceStub(self.target.channel)
        request = self.pb.GenerateRequest(model="tiny")
        request.prompt_token_ids.ids.extend(HEALTHY_IDS)
        request.stopping.max_tokens = 4
        request.stopping.ignore_eos = True
        ids = [i for r in stub.Generate(request, timeout=RPC_TIMEOUT) for i in r.token_ids]
        if self.baseline is None:
            self.baseline = ids
        expect(ids == self.baseline, f"greedy Generate gave {ids}, before {self.baseline}")

    def healthy_http(self):
        """A short greedy /v1/completions gives 200 and 4 tokens."""
        body = json.dumps({"model": "tiny", "prompt": HEALTHY_IDS, "max_tokens": 4,
                           "temperature": 0, "ignore_eos": True}).encode()
        status, _, reply = http_exchange(self.target.http_port,
                                         http_request("POST", "/v1/completions", body),
                                         timeout=RPC_TIMEOUT)
        expect(status == 200, f"/v1/completions: HTTP {status}: {reply[:300]!r}")
        usage = json.loads(reply)["usage"]
        expect(usage["completion_tokens"] == 4, f"/v1/completions usage {usage}")

    def still_serving(self, what, protocols):
        """After `what`: the process is alive and serves a normal request over each protocol.
        A server that died is started again (so that later checks run) and the check fails."""
        try:
            if self.target.alive():
                for protocol in protocols:
                    (self.healthy_grpc if protocol == "grpc" else self.healthy_http)()
                return
        except Exception:
            # A refused request may be the first sign of a crash that is still under way.
            try:
                self.target.server.process.wait(2)
            except subprocess.TimeoutExpired:
                raise
        code = self.target.server.process.returncode
        tail = self.target.server.tail(3)
        self.deaths.append(what)
        self.target.restart()
        self.baseline = None
        raise AssertionError(f"kiln-server died on this request ({describe_exit(code)}); "
                             f"started again. Its last lines:\n{tail}")

    # ---- part 1: the corpus ------------------------------------------------------------------

    def run_case(self, case, index):
        try:
            if case.protocol == "http":
                self.http_case(case)
            else:
                self.grpc_case(case)
        finally:
            # The case's own protocol every time; the other one every other case.
            other = "grpc" if case.protocol == "http" else "http"
            self.still_serving(case.name, [case.protocol] + ([other] if index % 2 else []))

    def http_case(self, case):
        if case.raw:
            data = case.body
        else:
            data = http_request(case.method, case.target, case.body, case.headers)
        status, headers, body = http_exchange(self.target.http_port, data)
        detail = f"HTTP {status}: {body[:300]!r}"
        expect(status == case.status, f"expected HTTP {case.status}, got {detail}")
        message = error_message(body)
        for wanted in case.messages:
            expect(wanted in message, f"HTTP {status} message does not name {wanted!r}: "
                                      f"{message!r}")
        if case.param is not None:
            param = json.loads(body)["error"].get("param")
            expect(param == case.param, f"error.param {param!r}, expected {case.param!r}: "
                                        f"{message!r}")

    def grpc_case(self, case):
        if case.text is not None:
            message_type = {"Generate": self.pb.GenerateRequest,
                            "Tokenize": self.pb.TokenizeRequest,
                            "Detokenize": self.pb.DetokenizeRequest}[case.rpc]
            payload = self.text_format.Parse(case.text, message_type()).SerializeToString()
        else:
            payload = case.body
        call = self.target.raw_rpcs[case.rpc]
        try:
            result = call(payload, timeout=RPC_TIMEOUT)
            if case.rpc == "Generate":
                result = list(result)
        except self.grpc.RpcError as e:
            code, details = e.code().name, e.details() or ""
        else:
            raise AssertionError(f"expected {case.code}, but the call succeeded")
        expect(code == case.code, f"expected {case.code}, got {code}: {details!r}")
        for wanted in case.messages:
            expect(wanted in details, f"{code} message does not name {wanted!r}: {details!r}")

    # ---- part 2: bad model files -------------------------------------------------------------

    def bad_models(self, checks):
        """Each bad model directory fails LoadModel with its code and message; `tiny` keeps
        serving; VmHWM grows by less than MEMORY_BOUND over the whole part."""
        cases = make_bad_models(self.tmp, self.model_dir)
        models = self.pb_grpc.ModelsStub(self.target.channel)
        pid, (_, peak_before) = self.target.pid(), self.target.memory()
        for case in cases:
            checks.run(f"model/{case[0]}", lambda case=case: self.load_bad_model(models, *case))

        def no_entries_left():
            listed = models.ListModels(self.pb.ListModelsRequest(), metadata=self.admin,
                                       timeout=RPC_TIMEOUT)
            names = sorted(m.name for m in listed.models)
            expect(names == ["tiny"], f"failed loads left entries: {names}")

        def memory_bounded():
            expect(self.target.pid() == pid, "kiln-server was started again meanwhile")
            rss, peak = self.target.memory()
            print(f"     VmHWM {peak_before >> 20} -> {peak >> 20} MiB, VmRSS now {rss >> 20} MiB",
                  flush=True)
            expect(peak - peak_before < MEMORY_BOUND,
                   f"VmHWM grew by {(peak - peak_before) >> 20} MiB over the bad models")

        checks.run("model/no_entries_left", no_entries_left)
        checks.run("model/memory_bounded", memory_bounded)

    def load_bad_model(self, models, name, path, code, messages):
        try:
            info = models.LoadModel(self.pb.LoadModelRequest(name=f"bad-{name}", path=path),
                                    metadata=self.admin, timeout=RPC_TIMEOUT)
        except self.grpc.RpcError as e:
            got, details = e.code().name, e.details() or ""
        else:
            models.UnloadModel(self.pb.UnloadModelRequest(name=f"bad-{name}"),
                               metadata=self.admin, timeout=RPC_TIMEOUT)
            raise AssertionError(f"LoadModel succeeded: {self.pb.ModelState.Name(info.state)}")
        finally:
            self.still_serving(f"model/{name}", ["grpc"])
        expect(got == code, f"expected {code}, got {got}: {details!r}")
        for wanted in messages:
            expect(wanted in details, f"{got} message does not name {wanted!r}: {details!r}")


def describe_exit(code):
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


# ---- part 2: the bad model directories --------------------------------------------------------

def read_safetensors_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def rewrite_safetensors_header(path, edit):
    """Replaces the JSON header with edit(header); the data region is kept as it is."""
    header, data_start = read_safetensors_header(path)
    with open(path, "rb") as f:
        f.seek(data_start)
        data = f.read()
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def make_bad_models(tmp, good_dir):
    """[(name, path, expected code, expected message substrings)] of bad models made from the
    tiny model, in <model root>/bad/ (and one outside the root, for the escapes)."""
    root = os.path.join(tmp, "models")
    bad = os.path.join(root, "bad")
    outside = os.path.join(tmp, "outside", "m")
    os.makedirs(bad)
    shutil.copytree(good_dir, outside)
    cases = []

    def clone(name):
        path = os.path.join(bad, name)
        shutil.copytree(good_dir, path)
        return path

    def weights(path):
        return os.path.join(path, "model.safetensors")

    def tensors_by_offset(header):
        return sorted((k for k in header if k != "__metadata__"),
                      key=lambda k: header[k]["data_offsets"][0])

    path = clone("truncated")
    os.truncate(weights(path), os.path.getsize(weights(path)) // 2)
    cases.append(("truncated", path, "DATA_LOSS", ["model.safetensors", "past the end"]))

    path = clone("offsets-past-end")

    def past_end(header):
        last = header[tensors_by_offset(header)[-1]]
        begin, end = last["data_offsets"]
        last["data_offsets"] = [begin + (1 << 30), end + (1 << 30)]
    rewrite_safetensors_header(weights(path), past_end)
    cases.append(("offsets-past-end", path, "DATA_LOSS", ["data_offsets", "past the end"]))

    path = clone("offsets-overlap")

    def overlap(header):
        first, second = tensors_by_offset(header)[:2]
        size = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
        start = header[first]["data_offsets"][0]
        header[second]["data_offsets"] = [start, start + size]
    rewrite_safetensors_header(weights(path), overlap)
    cases.append(("offsets-overlap", path, "INVALID_ARGUMENT", ["overlap"]))

    path = clone("shape-overflow")

    def huge_shape(header):
        header[tensors_by_offset(header)[0]]["shape"] = [1 << 62, 1 << 62]
    rewrite_safetensors_header(weights(path), huge_shape)
    cases.append(("shape-overflow", path, "INVALID_ARGUMENT", ["shape"]))

    path = clone("header-length-2p60")
    with open(weights(path), "r+b") as f:
        f.write(struct.pack("<Q", 1 << 60))
    cases.append(("header-length-2p60", path, "INVALID_ARGUMENT", ["header length"]))

    path = clone("header-not-json")
    with open(weights(path), "r+b") as f:
        f.seek(8)
        f.write(b"{oops")
    cases.append(("header-not-json", path, "INVALID_ARGUMENT", ["model.safetensors", "header"]))

    path = clone("empty-weights")
    os.truncate(weights(path), 0)
    cases.append(("empty-weights", path, "DATA_LOSS", ["model.safetensors", "0 bytes"]))

    for name, key, value in (("layers-1e9", "num_hidden_layers", 10 ** 9),
                             ("hidden-1e9", "hidden_size", 10 ** 9),
                             ("vocab-1e9", "vocab_size", 10 ** 9),
                             ("heads-0", "num_attention_heads", 0)):
        path = clone(name)
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config[key] = value
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
        cases.append((name, path, "INVALID_ARGUMENT", [key]))

    path = clone("config-not-json")
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write('{"num_hidden_layers": ')
    cases.append(("config-not-json", path, "INVALID_ARGUMENT", ["config.json"]))

    path = clone("config-missing")
    os.remove(os.path.join(path, "config.json"))
    cases.append(("config-missing", path, "NOT_FOUND", ["config.json"]))

    path = clone("tokenizer-not-json")
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        f.write("{ this is not json")
    cases.append(("tokenizer-not-json", path, "INVALID_ARGUMENT", ["tokenizer.json"]))

    link = os.path.join(bad, "dir-symlink")
    os.symlink(outside, link)
    cases.append(("dir-symlink", link, "PERMISSION_DENIED", ["outside the model roots"]))

    path = clone("file-symlink")
    os.remove(weights(path))
    os.symlink(weights(outside), weights(path))
    cases.append(("file-symlink", path, "PERMISSION_DENIED",
                  ["model.safetensors", "leaves the model directory"]))

    path = clone("shard-escape")
    header, _ = read_safetensors_header(weights(path))
    escape = os.path.relpath(weights(outside), path)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {k: escape for k in header
                                                  if k != "__metadata__"}}, f)
    os.remove(weights(path))
    cases.append(("shard-escape", path, "PERMISSION_DENIED", ["leaves the model directory"]))

    cases.append(("path-outside-root", outside, "PERMISSION_DENIED", ["outside the model roots"]))
    cases.append(("path-dotdot", os.path.join(root, "..", "outside", "m"), "PERMISSION_DENIED",
                  ["outside the model roots"]))
    cases.append(("path-missing", os.path.join(bad, "no-such-model"), "NOT_FOUND",
                  ["no-such-model"]))
    return cases


# ---- part 3: SIGTERM drain --------------------------------------------------------------------

class Stream(threading.Thread):
    """One Generate stream read in the background: its tokens, its end, its status."""

    def __init__(self, stub, request):
        super().__init__(daemon=True)
        self.stub, self.request = stub, request
        self.tokens, self.finish = [], None
        self.code = self.details = None
        self.first_token = threading.Event()
        self.ended_at = None

    def run(self):
        import grpc
        try:
            for response in self.stub.Generate(self.request, timeout=RPC_TIMEOUT):
                self.tokens.extend(response.token_ids)
                if self.tokens:
                    self.first_token.set()
                if response.finish_reason:
                    self.finish = response.finish_reason
            self.code = "OK"
        except grpc.RpcError as e:
            self.code, self.details = e.code().name, e.details() or ""
        self.ended_at = time.monotonic()
        self.first_token.set()


def drain(args, tmp, checks):
    import grpc
    from kiln.v1 import kiln_pb2 as pb
    from kiln.v1 import kiln_pb2_grpc as pb_grpc

    target = Target(args, tmp, "drain", ["--token-delay-for-testing", "50ms",
                                         "--shutdown-grace", f"{SHUTDOWN_GRACE:g}s"])
    stub = pb_grpc.InferenceStub(target.channel)

    def request(max_tokens):
        r = pb.GenerateRequest(model="tiny")
        r.prompt_token_ids.ids.extend(HEALTHY_IDS)
        r.stopping.max_tokens = max_tokens
        r.stopping.ignore_eos = True
        return r

    # The long stream first, then the short one: the signal lands while both run, and the short
    # one's remaining tokens (about 8 x 50 ms) fit in the grace period.
    long_stream, short_stream = Stream(stub, request(2000)), Stream(stub, request(8))
    signalled = exited = None
    try:
        long_stream.start()
        expect(long_stream.first_token.wait(10) and long_stream.tokens,
               f"the long stream produced no token ({long_stream.code} {long_stream.details})")
        short_stream.start()
        expect(short_stream.first_token.wait(10) and short_stream.tokens,
               f"the short stream produced no token ({short_stream.code})")
        target.server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.2)  # the signal handler has run; new calls must now be refused

        def refuses_new_generate():
            try:
                list(stub.Generate(request(2), timeout=5))
            except grpc.RpcError as e:
                expect(e.code() == grpc.StatusCode.UNAVAILABLE,
                       f"a Generate after SIGTERM: {e.code().name} {e.details()!r}")
            else:
                raise AssertionError("a Generate after SIGTERM was served")

        def refuses_new_http():
            body = json.dumps({"model": "tiny", "prompt": HEALTHY_IDS, "max_tokens": 2}).encode()
            try:
                status, _, reply = http_exchange(target.http_port,
                                                 http_request("POST", "/v1/completions", body), 5)
            except ConnectionError:
                return  # refused or closed: the port no longer serves
            expect(status == 503 and "shutting down" in error_message(reply),
                   f"a completion after SIGTERM: HTTP {status} {reply[:200]!r}")

        checks.run("drain/refuses_new_generate", refuses_new_generate)
        checks.run("drain/refuses_new_http", refuses_new_http)

        def short_completes():
            short_stream.join(SHUTDOWN_GRACE + 3)
            expect(not short_stream.is_alive(), "the short stream did not end")
            expect(short_stream.code == "OK", f"short stream: {short_stream.code} "
                                              f"{short_stream.details!r}")
            expect(len(short_stream.tokens) == 8 and short_stream.finish == pb.LENGTH,
                   f"short stream: {len(short_stream.tokens)} tokens, finish "
                   f"{short_stream.finish}")

        def long_cut_at_grace():
            long_stream.join(signalled + SHUTDOWN_GRACE + 3 - time.monotonic())
            expect(not long_stream.is_alive(),
                   f"the long stream still runs {SHUTDOWN_GRACE + 3:g} s after SIGTERM")
            expect(long_stream.code == "UNAVAILABLE" and "shutting down" in long_stream.details,
                   f"long stream ended {long_stream.code} {long_stream.details!r} "
                   f"{long_stream.ended_at - signalled:.2f} s after SIGTERM, after "
                   f"{len(long_stream.tokens)} tokens")
            expect(len(long_stream.tokens) < 2000, "the long stream ran to its end")

        def exits_zero():
            nonlocal exited
            try:
                code = target.server.process.wait(signalled + SHUTDOWN_GRACE + 5 -
                                                  time.monotonic())
            except subprocess.TimeoutExpired:
                raise AssertionError(f"kiln-server still runs {SHUTDOWN_GRACE + 5:g} s "
                                     "after SIGTERM")
            exited = time.monotonic()
            expect(code == 0, f"kiln-server ended with {describe_exit(code)}")

        checks.run("drain/short_stream_completes", short_completes)
        checks.run("drain/long_stream_unavailable", long_cut_at_grace)
        checks.run("drain/exits_zero", exits_zero)
        if exited is not None:
            print(f"     exit {exited - signalled:.2f} s after SIGTERM", flush=True)
    finally:
        code, _ = target.stop()
        if any(name.startswith("drain/") for name in checks.failed):
            print(f"---- drain kiln-server output (exit {code}) ----\n{target.server.tail()}\n----")


# ---- main -------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True, help="the kiln-server binary")
    parser.add_argument("--kiln", required=True, help="the kiln CLI binary")
    parser.add_argument("--proto-dir", required=True, help="the repository's proto/ directory")
    parser.add_argument("--corpus", default=CORPUS, help="the bad-requests directory")
    parser.add_argument("--only", help="run only the corpus cases whose path contains this")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    start = time.monotonic()

    tmp = tempfile.mkdtemp(prefix="kiln-hostile-")
    checks = Checks(start + TOTAL_BUDGET)
    target = None
    tried = 0
    try:
        cases = load_corpus(args.corpus, args.only)
        test_server.generate_stubs(args.proto_dir, os.path.join(tmp, "gen"))
        model_dir = os.path.join(tmp, "models", "m")
        subprocess.run([args.kiln, "synth", "--preset=kiln-tiny", "--dtype=f32",
                        f"--out={model_dir}"], check=True, timeout=60, stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "admin-token"), "w") as f:
            f.write(ADMIN_TOKEN + "\n")
        target = Target(args, tmp, "server", LIMIT_FLAGS)
        print(f"hostile: kiln-server ready after {time.monotonic() - start:.1f} s; "
              f"{len(cases)} bad requests", flush=True)
        hostile = Hostile(tmp, target)
        checks.run("healthy_at_start", lambda: hostile.still_serving("start", ["grpc", "http"]))

        for index, case in enumerate(cases):
            checks.run(case.name, lambda case=case, index=index: hostile.run_case(case, index))
            tried += 1
        rss, peak = target.memory()
        print(f"hostile: {tried} bad requests tried; kiln-server VmHWM {peak >> 20} MiB, "
              f"VmRSS {rss >> 20} MiB", flush=True)
        if not args.only:
            hostile.bad_models(checks)

        def alive_at_end():
            expect(not hostile.deaths, f"kiln-server died after: {', '.join(hostile.deaths)}")
            expect(target.alive(), "kiln-server is not running")
            hostile.still_serving("the end", ["grpc", "http"])
        checks.run("alive_at_end", alive_at_end)

        if not args.only:
            drain(args, tmp, checks)
    except Exception as e:  # noqa: BLE001 - setup failed: report it, stop the servers
        checks.failed.append("setup")
        print(f"FAIL setup: {e}", flush=True)
        traceback.print_exc()
    finally:
        if target is not None:
            code, seconds = target.stop()
            if checks.failed:
                print(f"---- kiln-server output (exit {code}) ----\n{target.server.tail()}\n----")
        if args.keep:
            print(f"hostile: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"hostile: {tried} bad requests tried; {len(checks.passed)} checks passed, "
          f"{len(checks.failed)} failed" +
          (f", {len(checks.skipped)} skipped" if checks.skipped else "") +
          f" in {time.monotonic() - start:.1f} s", flush=True)
    if checks.failed:
        print("hostile: failed: " + ", ".join(checks.failed), flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
