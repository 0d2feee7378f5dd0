"""The Triton step of `make serving-check`: a published prefix's Triton repository loaded by a real
`tritonserver`, the one shipped in the nvidia-pytriton wheel (installed into the serving environment).

That build has the python backend only, no onnxruntime backend, so two servers run on 127.0.0.1:
- the published repository as it is (`--model-control-mode=explicit`, one load request): Triton reads
  the folder, parses config.pbtxt, picks the version its version policy names among the integer version
  folders, completes the configuration (logged with `--log-verbose=1`) and fails only where it looks for
  the onnxruntime backend. `published_verdict` asserts that this is the only failure;
- a stand-in: a copy of the repository whose config.pbtxt names the python backend (nothing else
  changed) and whose served version folder holds `model.py`, running the same model.onnx with
  onnxruntime. Triton then checks the inputs' and outputs' dims and reshape and reads the labels file;
  a request of raw rows (NaN and "" where missing, sent in Triton's binary tensor format) must answer
  the bundle's probabilities, and the classification extension its labels. The stub runs model.py in
  `<serving venv>/triton-stub`, an environment with numpy 1 (TritonInstall says why).
What no server here checks: Triton's onnxruntime backend itself (its autocompletion against the ONNX
file, its kernels, the ONNX IR version and opset it reads), GPUs, and gRPC.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.measure import wait_until_answering

START_SECONDS = 120
ATOL = 1e-5  # float32 probabilities: the bundle's torch model against onnxruntime's kernels
BACKEND_MISSING = "unable to find backend library for backend 'onnxruntime'"
COMPLETED_CONFIG = "Server side auto-completed config"
STUB_VENV = "triton-stub"
STUB = "triton_python_backend_stub"
TRITON_DATATYPES = {"float64": "FP64", "float32": "FP32"}  # and text: BYTES
JSON_NUMBER_TYPES = {value: key for key, value in TRITON_DATATYPES.items()}
# Triton's answers (HTTP 500) to a JSON element it cannot read as the tensor's type: null in place of a gap.
JSON_NUMBER_REFUSED = "Unable to parse 'data': attempt to access JSON non-number as double"
JSON_TEXT_REFUSED = "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
STAND_IN_MODEL = '''"""Triton's python backend running the published model.onnx with onnxruntime (serving check only)."""

import os

import numpy as np
import onnxruntime
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.session = onnxruntime.InferenceSession(
            os.path.join(folder, "model.onnx"), providers=["CPUExecutionProvider"]
        )
        self.outputs = [output.name for output in self.session.get_outputs()]

    def execute(self, requests):
        return [self.answer(request) for request in requests]

    def answer(self, request):
        feeds = {}
        for tensor in self.session.get_inputs():
            array = pb_utils.get_input_tensor_by_name(request, tensor.name).as_numpy()
            feeds[tensor.name] = np.char.decode(array.astype(bytes), "utf-8") if array.dtype == object else array
        values = self.session.run(self.outputs, feeds)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(name, value.astype(object) if value.dtype.kind in "OU" else value)
            for name, value in zip(self.outputs, values)
        ])
'''


def published_verdict(index: list[dict], log: str, published: str, served: str, unserved: str) -> str:
    """What Triton said of the published repository (`published`: its config.pbtxt), without an
    onnxruntime backend: it listed the model, loaded `served` alone (not the newer, unpromoted
    `unserved`), completed the configuration with the published tensors, labels file and batching, and
    failed for the missing backend and nothing else. Raises AssertionError naming what differs."""
    name = re.search(r'^name: "((?:[^"\\]|\\.)*)"', published, re.MULTILINE).group(1)
    if problems := re.findall(r"Poll failed for model directory.*|failed to read text proto.*", log):
        raise AssertionError(f"Triton could not read the repository: {problems[0]}")
    if f"loading: {name}:{unserved}" in log:
        raise AssertionError(f"Triton loaded version {unserved}, which config.pbtxt does not serve")
    if f"loading: {name}:{served}" not in log:
        failures = re.findall(rf"failed to load model '{re.escape(name)}'.*", log)
        raise AssertionError(f"Triton did not load version {served} of {name!r}: {failures[-1:]}")
    entries = [entry for entry in index if entry.get("name") == name]
    if [entry.get("version") for entry in entries] != [served]:
        raise AssertionError(f"the repository index lists {entries}, not version {served} alone")
    if BACKEND_MISSING not in (reason := entries[0].get("reason", "")):
        raise AssertionError(f"version {served} failed to load for another reason: {reason!r}")
    check_completed(completed_config(log), published, served)
    return (
        f"Triton parsed config.pbtxt, chose version {served} of {name!r} (not the newer {unserved}), "
        f"completed the configuration ({len(tensor_names(published))} tensors, labels file, dynamic "
        "batching, model.onnx) and failed only for the missing onnxruntime backend"
    )


def check_completed(completed: str, published: str, served: str) -> None:
    """The configuration Triton completed states what config.pbtxt does."""
    statements = {
        "backend": 'backend: "onnxruntime"',
        "model file": 'default_model_filename: "model.onnx"',
        "version policy": f"versions: {served}\n",
        "labels file": f'label_filename: "labels-{served}.txt"',
        "dynamic batching": "\ndynamic_batching {",
    }
    differing = [what for what, statement in statements.items() if statement not in completed]
    if tensor_names(completed) != tensor_names(published):
        differing.append("tensors")
    if differing:
        raise AssertionError(f"Triton's completed configuration differs in {differing}: {completed!r}")


def completed_config(log: str) -> str:
    """The configuration Triton logs (with --log-verbose=1) once it has parsed and completed it."""
    start = log.find(COMPLETED_CONFIG)
    if start < 0:
        return ""
    block = log[start + len(COMPLETED_CONFIG) :]
    end = re.search(r"^[IWE]\d{4} ", block, re.MULTILINE)
    return block[: end.start()] if end else block


def tensor_names(config: str) -> list[str]:
    """The input and output names of a configuration, in its order: as config.pbtxt writes them, or as
    Triton logs its completed configuration."""
    entry = r'^(?:    |(?:input|output) \{\n  )name: "((?:[^"\\]|\\.)*)"'
    return re.findall(entry, config, re.MULTILINE)


def classification_labels(answer: dict, output: str) -> list[str]:
    """The top class label of each row, from a classification answer ("score:index:label" strings)."""
    for tensor in answer["outputs"]:
        if tensor["name"] == output:
            return [entry.split(":", 2)[2] for entry in tensor["data"]]
    raise AssertionError(f"no {output!r} in the answer: {[tensor['name'] for tensor in answer['outputs']]}")


def output_array(answer: dict, output: str) -> np.ndarray:
    for tensor in answer["outputs"]:
        if tensor["name"] == output:
            return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    raise AssertionError(f"no {output!r} in the answer: {[tensor['name'] for tensor in answer['outputs']]}")


def binary_request(feeds: dict[str, np.ndarray], outputs: list[dict]) -> tuple[bytes, int]:
    """A v2 inference request with its inputs in Triton's binary tensor format (JSON cannot carry NaN):
    the JSON header, then each input's bytes. Returns the body and the header's length."""
    inputs, blobs = [], []
    for name, array in feeds.items():
        blob = tensor_bytes(array)
        datatype = "BYTES" if array.dtype.kind in "OU" else TRITON_DATATYPES[str(array.dtype)]
        inputs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                       "parameters": {"binary_data_size": len(blob)}})  # fmt: skip
        blobs.append(blob)
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + b"".join(blobs), len(header)


def tensor_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind in "OU":
        encoded = [str(value).encode() for value in array.ravel()]
        return b"".join(len(value).to_bytes(4, "little") + value for value in encoded)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


class TritonRefusal(Exception):
    """An HTTP error status and message, as Triton answers a request it cannot read."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


def json_request(feeds: dict[str, np.ndarray], outputs: list[dict], null_gaps: bool = False) -> bytes:
    """A v2 inference request with its inputs as JSON: rows of text, or of numbers with a gap as the
    literal NaN (which Python's json writes), or as `null` with `null_gaps`."""
    inputs = [
        {"name": name, "shape": list(array.shape), "data": json_data(array, null_gaps),
         "datatype": "BYTES" if array.dtype.kind in "OU" else TRITON_DATATYPES[str(array.dtype)]}
        for name, array in feeds.items()
    ]  # fmt: skip
    return json.dumps({"inputs": inputs, "outputs": outputs}).encode()


def json_data(array: np.ndarray, null_gaps: bool) -> list:
    if array.dtype.kind in "OU" or not null_gaps:
        return array.tolist()
    return np.where(np.isnan(array), None, array.astype(object)).tolist()


def json_inputs(body: bytes) -> dict[str, np.ndarray]:
    """The inputs of a JSON request as Triton's HTTP front end reads them (server's src/http_server.cc,
    ReadDataFromJson, over common's triton_json.h): the body is parsed with rapidjson's
    kParseNanAndInfFlag, so NaN, Infinity and -Infinity are numbers; an element of an FP32 or FP64
    tensor that is not a number (`null`, `true`, "1.5") fails as TRITONSERVER_ERROR_INTERNAL, which
    Triton answers with HTTP 500, and so does a BYTES element that is not a string. Raises TritonRefusal."""
    request = json.loads(body)  # Python's json takes NaN, Infinity and -Infinity as rapidjson does
    return {tensor["name"]: json_tensor(tensor) for tensor in request["inputs"]}


def json_tensor(tensor: dict) -> np.ndarray:
    values = list(flattened(tensor["data"]))
    if tensor["datatype"] == "BYTES":
        if not all(isinstance(value, str) for value in values):
            raise TritonRefusal(500, JSON_TEXT_REFUSED)
        array = np.array(values, dtype=object)
    else:
        if not all(isinstance(value, int | float) and not isinstance(value, bool) for value in values):
            raise TritonRefusal(500, JSON_NUMBER_REFUSED)
        array = np.array(values, dtype=np.dtype(JSON_NUMBER_TYPES[tensor["datatype"]]))
    if array.size != int(np.prod(tensor["shape"])):
        raise TritonRefusal(500, "Failed to parse 'data' field: shape does not match true shape")
    return array.reshape(tensor["shape"])


def flattened(data):
    for value in data:
        if isinstance(value, list):
            yield from flattened(value)
        else:
            yield value


def stand_in_config(published: str) -> str:
    """The published config.pbtxt with the python backend in place of onnxruntime, nothing else changed."""
    config, count = re.subn(r'^backend: "onnxruntime"$', 'backend: "python"', published, flags=re.MULTILINE)
    if count != 1:
        raise AssertionError("config.pbtxt does not name the onnxruntime backend once")
    return config


class TritonInstall:
    """The tritonserver of the nvidia-pytriton wheel in the serving environment `venv`, and the environment
    its python backend's stub runs models in: `venv`/triton-stub, with numpy 1 (the wheel's stub hands a
    text tensor to numpy 2 as bytes it garbles) and onnxruntime."""

    def __init__(self, venv: Path):
        found = sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver"))
        if not found:
            raise RuntimeError(f"no nvidia-pytriton in {venv} (make serving-check installs it)")
        self.stub_venv = venv / STUB_VENV
        if not (self.stub_venv / "bin" / "python").exists():
            raise RuntimeError(f"no {self.stub_venv} (make serving-check makes it)")
        self.root = found[0]
        self.binary = self.root / "bin" / "tritonserver"
        self.libraries = self.root.parents[1] / "nvidia_pytriton.libs"

    def backends(self, folder: Path) -> Path:
        """A backends folder whose python backend has the stub of the stub environment's Python."""
        version = run_python(self.stub_venv, "import sys; print('%d.%d' % sys.version_info[:2])")
        shutil.copytree(self.root / "backends", folder, dirs_exist_ok=True)
        shutil.copy(self.root / "python_backend_stubs" / version / STUB, folder / "python")
        return folder

    def environment(self) -> dict[str, str]:
        """The stub environment's PATH first: the stub runs the Python it finds there, with its packages;
        the wheel's libraries and libpython where the stub, copied out of the wheel, finds them."""
        libdir = run_python(self.stub_venv, "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))")
        environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        environment["PATH"] = f"{self.stub_venv / 'bin'}{os.pathsep}{environment.get('PATH', '')}"
        environment["VIRTUAL_ENV"] = str(self.stub_venv)
        libraries = [str(self.libraries), libdir, environment.get("LD_LIBRARY_PATH", "")]
        environment["LD_LIBRARY_PATH"] = os.pathsep.join(part for part in libraries if part)
        return environment


def run_python(venv: Path, code: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


class TritonServer:
    """`tritonserver` on 127.0.0.1 (HTTP only), loading models when asked, its log in `log_path`."""

    def __init__(self, install: TritonInstall, repository: Path, backends: Path, log_path: Path, port: int):
        self.url = f"http://127.0.0.1:{port}"
        command = [str(install.binary), f"--model-repository={repository}", f"--backend-directory={backends}",
                   "--model-control-mode=explicit", "--exit-on-error=false", "--log-verbose=1",
                   "--http-address=127.0.0.1", f"--http-port={port}", "--allow-grpc=false", "--allow-metrics=false"]  # fmt: skip
        self.log_path = log_path
        self.log = log_path.open("w")
        self.process = subprocess.Popen(command, cwd=log_path.parent, env=install.environment(),
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def wait_live(self) -> None:
        wait_until_answering(
            self.process, f"{self.url}/v2/health/live", START_SECONDS, "tritonserver", self.tail
        )

    def call(self, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, object]:
        """The status and the JSON answer of a request; POST where there is a body."""
        request = urllib.request.Request(f"{self.url}{path}", data=body, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> str:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the server and its python backend stubs
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        return self.log_path.read_text(errors="replace")


def check_published(
    install: TritonInstall, prefix: Path, versions: tuple[str, str], work: Path, port: int
) -> str:
    """The published repository as it is: one load request, then the repository index and the log."""
    from tasks.core.publish.layouts import TRITON, TRITON_CONFIG
    from tasks.core.publish.retention import model_name

    name, (served, unserved) = model_name(str(prefix)), versions
    published = (prefix / TRITON / name / TRITON_CONFIG).read_text()
    work.mkdir(parents=True, exist_ok=True)
    server = TritonServer(
        install, prefix / TRITON, install.backends(work / "backends"), work / "triton.log", port
    )
    try:
        server.wait_live()
        status, answer = server.call(f"/v2/repository/models/{name}/load", b"{}")
        if status == 200:
            raise AssertionError(f"the model loaded without an onnxruntime backend: {answer}")
        _, index = server.call("/v2/repository/index", b"{}")
    finally:
        log = server.stop()
    return published_verdict(index, log, published, served, unserved)


def stand_in_repository(prefix: Path, served: str, folder: Path) -> Path:
    """The published model folder with the python backend: its config.pbtxt so changed, its labels files,
    and the served version's model.onnx beside a model.py that runs it."""
    from tasks.core.publish.layouts import ONNX_MODEL, TRITON, TRITON_CONFIG
    from tasks.core.publish.retention import model_name

    name = model_name(str(prefix))
    published, model = prefix / TRITON / name, folder / name
    shutil.rmtree(folder, ignore_errors=True)  # a kept work folder's earlier stand-in
    (model / served).mkdir(parents=True)
    for labels in published.glob("labels-*.txt"):
        shutil.copy(labels, model)
    (model / TRITON_CONFIG).write_text(stand_in_config((published / TRITON_CONFIG).read_text()))
    shutil.copy(published / served / ONNX_MODEL, model / served)
    (model / served / "model.py").write_text(STAND_IN_MODEL)
    return folder


def check_stand_in(
    install: TritonInstall, prefix: Path, served: str, bundle, frame, work: Path, port: int
) -> str:
    """The python-backend stand-in: loaded, and a request of raw rows answered as the bundle answers."""
    from tasks.core.bundle.raw_inputs import raw_feeds
    from tasks.core.publish.layouts import LABELLED_OUTPUT
    from tasks.core.publish.retention import model_name

    name = model_name(str(prefix))
    work.mkdir(parents=True, exist_ok=True)
    repository = stand_in_repository(prefix, served, work / "stand-in")
    server = TritonServer(
        install, repository, install.backends(work / "backends"), work / "stand-in.log", port
    )
    try:
        server.wait_live()
        status, answer = server.call(f"/v2/repository/models/{name}/load", b"{}")
        if status != 200:
            raise AssertionError(f"the stand-in did not load: {answer}")
        feeds = raw_feeds(frame, bundle.encoding)
        probabilities = output_array(infer(server, name, feeds, {}), LABELLED_OUTPUT)
        labels = classification_labels(infer(server, name, feeds, {"classification": 1}), LABELLED_OUTPUT)
        as_json = json_gaps(server, name, feeds)
    finally:
        server.stop()
    expected = bundle.predict_proba(frame)
    if not np.allclose(as_json, expected, atol=ATOL, equal_nan=False):
        raise AssertionError(
            "the JSON request's probabilities (NaN literals for gaps) differ from the bundle's"
        )
    if labels != bundle.labels(expected.argmax(axis=1)).tolist():
        raise AssertionError("the classification's labels differ from the bundle's predict")
    difference = float(np.abs(probabilities - expected).max())
    if difference > ATOL:
        raise AssertionError(f"Triton's probabilities differ from the bundle's by {difference:.2e}")
    return (
        f"{len(frame):,} raw rows (NaN and empty text where missing) through /v2/models/{name}/infer: "
        f"probabilities within {difference:.1e} of the bundle's, classification labels from the labels file "
        "equal; as JSON, NaN literals answered alike and a null refused with HTTP 500"
    )


def json_gaps(server: TritonServer, name: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The rows as a JSON request, gaps as NaN literals: the probabilities Triton answers. The same
    request with `null` for the first gap must be refused as json_inputs says."""
    from tasks.core.publish.layouts import LABELLED_OUTPUT

    outputs = [{"name": LABELLED_OUTPUT, "parameters": {"binary_data": False}}]
    body = json_request(feeds, outputs)
    status, answer = server.call(f"/v2/models/{name}/infer", body, {"Content-Type": "application/json"})
    if status != 200:
        raise AssertionError(f"a JSON request with NaN literals answered HTTP {status}: {answer}")
    with_null = json_request(feeds, outputs, null_gaps=True)
    if b"null" not in with_null:
        raise AssertionError("the rows have no number gap to send as null")
    refused = server.call(f"/v2/models/{name}/infer", with_null, {"Content-Type": "application/json"})
    if refused != (500, {"error": JSON_NUMBER_REFUSED}):
        raise AssertionError(
            f"a null in a number input answered {refused}, not HTTP 500 {JSON_NUMBER_REFUSED!r}"
        )
    return output_array(answer, LABELLED_OUTPUT)


def infer(server: TritonServer, name: str, feeds: dict[str, np.ndarray], parameters: dict) -> dict:
    from tasks.core.publish.layouts import LABELLED_OUTPUT

    output = {"name": LABELLED_OUTPUT, "parameters": {"binary_data": False, **parameters}}
    body, header_length = binary_request(feeds, [output])
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(header_length),
    }
    status, answer = server.call(f"/v2/models/{name}/infer", body, headers)
    if status != 200:
        raise AssertionError(f"inference answered HTTP {status}: {answer}")
    return answer


def publish_two_versions(bundle_dir: str, prefix: Path) -> tuple[str, str]:
    """The bundle published twice: the first version promoted (config.pbtxt serves it), the second,
    newer, not. Returns the two versions."""
    from tasks.core.publish.versions import publish_bundle

    served = publish_bundle(bundle_dir, str(prefix)).rsplit("/", 1)[1]
    unserved = publish_bundle(bundle_dir, str(prefix), promote=False).rsplit("/", 1)[1]
    return served, unserved


def run_triton_checks(
    venv: Path, work: Path, bundle_dir: str, bundle, frame, free_port
) -> list[tuple[str, str]]:
    """Each check's name and its result ("FAILED: ..." where it failed)."""
    results = []
    try:
        install = TritonInstall(venv)
        prefix = work / "published" / "churn"
        versions = publish_two_versions(bundle_dir, prefix)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        return [("triton", f"FAILED: {error}")]
    for name, check in (
        ("triton repository", lambda: check_published(install, prefix, versions, work / "triton", free_port())),
        ("triton python stand-in",
         lambda: check_stand_in(install, prefix, versions[0], bundle, frame, work / "triton", free_port())),
    ):  # fmt: skip
        try:
            results.append((name, check()))
        except (AssertionError, RuntimeError, subprocess.CalledProcessError) as error:
            results.append((name, f"FAILED: {error}"))
    return results
