"""The Triton step of the serving check judged on recorded answers of tritonserver 2.x (nvidia-pytriton
0.7.0's build, without an onnxruntime backend): no server runs here."""

import json
import math

import numpy as np
import pytest

from benchmarks.triton_check import (
    JSON_NUMBER_REFUSED,
    JSON_TEXT_REFUSED,
    TritonRefusal,
    binary_request,
    classification_labels,
    json_inputs,
    json_request,
    published_verdict,
    stand_in_config,
    tensor_names,
)
from tasks.core.publish.layouts import Tensor, triton_config

SERVED, UNSERVED = "20261126062338", "20261126062339"
PUBLISHED = triton_config(
    "churn",
    int(SERVED),
    [Tensor("amount", "TYPE_FP64", [1]), Tensor("home city", "TYPE_STRING", [1])],
    [Tensor("probabilities", "TYPE_FP32", [3]), Tensor("label", "TYPE_STRING", [1], reshape=[])],
    f"labels-{SERVED}.txt",
)
BACKEND_MISSING = (
    "Invalid argument: unable to find backend library for backend 'onnxruntime', try specifying runtime "
    "on the model configuration."
)
COMPLETED = f"""I1126 06:23:38.801821 21947 model_config_utils.cc:716] "Server side auto-completed config: "
name: "churn"
platform: "onnxruntime_onnx"
version_policy {{
  specific {{
    versions: {SERVED}
  }}
}}
max_batch_size: 8192
input {{
  name: "amount"
  data_type: TYPE_FP64
  dims: 1
}}
input {{
  name: "home city"
  data_type: TYPE_STRING
  dims: 1
}}
output {{
  name: "probabilities"
  data_type: TYPE_FP32
  dims: 3
  label_filename: "labels-{SERVED}.txt"
}}
output {{
  name: "label"
  data_type: TYPE_STRING
  dims: 1
  reshape {{
  }}
}}
default_model_filename: "model.onnx"
dynamic_batching {{
}}
backend: "onnxruntime"

"""
LOADED = f"""I1126 06:23:38.801916 21947 model_lifecycle.cc:472] "loading: churn:{SERVED}"
E1126 06:23:38.802020 21947 model_lifecycle.cc:642] "failed to load 'churn' version {SERVED}: {BACKEND_MISSING}"
I1126 06:23:38.802034 21947 model_lifecycle.cc:777] "failed to load 'churn'"
I1126 06:23:38.802712 21947 http_server.cc:4599] "HTTP request: 2 /v2/repository/index"
"""
START = """E1126 06:23:38.514102 21947 server.cc:241] "CudaDriverHelper has not been initialized."
I1126 06:23:38.800861 21947 http_server.cc:4599] "HTTP request: 2 /v2/repository/models/churn/load"
"""
LOG = START + COMPLETED + LOADED
INDEX = [{"name": "churn", "version": SERVED, "state": "UNAVAILABLE", "reason": BACKEND_MISSING}]


def test_the_recorded_answers_pass_naming_the_served_version():
    verdict = published_verdict(INDEX, LOG, PUBLISHED, SERVED, UNSERVED)
    assert f"version {SERVED} of 'churn' (not the newer {UNSERVED})" in verdict
    assert "4 tensors" in verdict


def test_a_config_triton_cannot_parse_fails():
    log = START + (
        'E1126 06:17:37.935492 18235 model_repository_manager.cc:1460] "Poll failed for model directory '
        "'churn': failed to read text proto from /models/churn/config.pbtxt\"\n"
    )
    with pytest.raises(AssertionError, match="could not read the repository: Poll failed"):
        published_verdict([{"name": "churn"}], log, PUBLISHED, SERVED, UNSERVED)


def test_a_missing_version_folder_fails_with_triton_s_reason():
    log = START + (
        "E1126 06:17:38.525749 18275 model_repository_manager.cc:724] \"failed to load model 'churn': at "
        "least one version must be available under the version policy of model 'churn'\"\n"
    )
    with pytest.raises(AssertionError, match=f"did not load version {SERVED}.*at least one version"):
        published_verdict([], log, PUBLISHED, SERVED, UNSERVED)


def test_loading_the_unpromoted_version_fails():
    log = LOG + f'I1126 06:23:38.801916 21947 model_lifecycle.cc:472] "loading: churn:{UNSERVED}"\n'
    with pytest.raises(AssertionError, match=f"loaded version {UNSERVED}"):
        published_verdict(INDEX, log, PUBLISHED, SERVED, UNSERVED)


def test_an_index_of_two_versions_fails():
    index = [*INDEX, {**INDEX[0], "version": UNSERVED}]
    with pytest.raises(AssertionError, match="not version .* alone"):
        published_verdict(index, LOG, PUBLISHED, SERVED, UNSERVED)


def test_a_failure_other_than_the_missing_backend_fails():
    index = [{**INDEX[0], "reason": "Invalid argument: model input 'amount' must specify 'dims'"}]
    with pytest.raises(AssertionError, match="another reason.*must specify 'dims'"):
        published_verdict(index, LOG, PUBLISHED, SERVED, UNSERVED)


@pytest.mark.parametrize(
    ("recorded", "written", "differing"),
    [
        (f'label_filename: "labels-{SERVED}.txt"\n', "", "labels file"),
        ('name: "home city"', 'name: "city"', "tensors"),
        ("dynamic_batching {\n}\n", "", "dynamic batching"),
        (f"versions: {SERVED}\n", f"versions: {UNSERVED}\n", "version policy"),
    ],
)
def test_a_completed_configuration_that_differs_from_the_published_one_fails(recorded, written, differing):
    log = START + COMPLETED.replace(recorded, written) + LOADED
    with pytest.raises(AssertionError, match=f"differs in \\['{differing}'\\]"):
        published_verdict(INDEX, log, PUBLISHED, SERVED, UNSERVED)


def test_tensor_names_read_both_the_written_and_the_completed_configuration():
    assert tensor_names(PUBLISHED) == ["amount", "home city", "probabilities", "label"]
    assert tensor_names(COMPLETED) == ["amount", "home city", "probabilities", "label"]
    quoted = triton_config("m", 1, [Tensor('a "b"', "TYPE_FP64", [1])], [], "l.txt")
    assert tensor_names(quoted) == ['a \\"b\\"']


def test_classification_labels_keep_a_label_holding_colons():
    answer = {"outputs": [{"name": "probabilities", "data": ["0.61:2:high", "0.5:0:a:b"]}]}
    assert classification_labels(answer, "probabilities") == ["high", "a:b"]
    with pytest.raises(AssertionError, match="no 'label'"):
        classification_labels(answer, "label")


def test_a_binary_request_carries_nan_and_text_after_its_json_header():
    feeds = {
        "amount": np.array([[1.5], [math.nan]]),
        "home city": np.array([["paris"], [""]], dtype=object),
    }
    body, length = binary_request(feeds, [{"name": "probabilities"}])
    header = json.loads(body[:length])
    inputs = [(entry["datatype"], entry["shape"]) for entry in header["inputs"]]
    assert inputs == [("FP64", [2, 1]), ("BYTES", [2, 1])]
    numbers = np.frombuffer(body[length : length + 16], "<f8")
    assert numbers[0] == 1.5 and math.isnan(numbers[1])
    assert body[length + 16 :] == b"\x05\x00\x00\x00paris\x00\x00\x00\x00"
    assert header["inputs"][1]["parameters"]["binary_data_size"] == 13


def test_the_stand_in_changes_the_backend_alone():
    config = stand_in_config(PUBLISHED)
    assert config == PUBLISHED.replace('backend: "onnxruntime"', 'backend: "python"')
    with pytest.raises(AssertionError, match="onnxruntime backend once"):
        stand_in_config(config)


def test_a_json_request_carries_a_gap_as_the_nan_literal_triton_parses():
    feeds = {"amount": np.array([[1.5], [math.nan]]), "home city": np.array([["paris"], [""]], dtype=object)}
    body = json_request(feeds, [{"name": "probabilities"}])
    assert b"[[1.5], [NaN]]" in body and b'[["paris"], [""]]' in body
    read = json_inputs(body)
    assert (
        read["amount"].dtype == np.float64
        and read["amount"][0, 0] == 1.5
        and math.isnan(read["amount"][1, 0])
    )
    assert read["home city"].tolist() == [["paris"], [""]]
    assert json_inputs(body.replace(b"NaN", b"-Infinity"))["amount"][1, 0] == -math.inf


@pytest.mark.parametrize(
    ("tensor", "refusal"),
    [
        ({"datatype": "FP64", "shape": [2, 1], "data": [[1.5], [None]]}, JSON_NUMBER_REFUSED),
        ({"datatype": "FP32", "shape": [2], "data": [True, 1.0]}, JSON_NUMBER_REFUSED),
        ({"datatype": "FP32", "shape": [2], "data": ["1.5", 1.0]}, JSON_NUMBER_REFUSED),
        ({"datatype": "BYTES", "shape": [2, 1], "data": [["paris"], [None]]}, JSON_TEXT_REFUSED),
        ({"datatype": "FP64", "shape": [3], "data": [1.0, 2.0]}, "shape does not match"),
    ],
)
def test_a_json_element_triton_cannot_read_is_refused_with_http_500(tensor, refusal):
    body = json.dumps({"inputs": [{"name": "amount", **tensor}]}).encode()
    with pytest.raises(TritonRefusal, match="HTTP 500") as refused:
        json_inputs(body)
    assert refusal in refused.value.message


def test_null_gaps_are_written_where_asked():
    feeds = {"amount": np.array([[1.5], [math.nan]])}
    body = json_request(feeds, [], null_gaps=True)
    assert json.loads(body)["inputs"][0]["data"] == [[1.5], [None]]
