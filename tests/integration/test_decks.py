"""The Decks of a local run: every task of the shared hardware comparison writes one, with its sections
and real charts, and a headless browser renders one; a spawned DDP worker loads neither the task
definitions nor the charts nor TensorFlow, and writes its TensorBoard events without it (the Decks'
parts: tests/unit/plumbing/test_decks.py)."""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

EXPECTED = {
    "preprocess": (
        ["Dataset profile", "Columns (as preprocessing read them)", "Class balance", "Feature statistics"],
        ["class-balance", "feature-stats"],
    ),
    "train_torch": (
        ["Learning curves", "Utilisation", "samples/s"],
        ["loss", "accuracy", "utilisation", "memory"],
    ),
    "train_tf_tpu": (["Learning curves", "Utilisation"], ["loss", "accuracy", "utilisation"]),
    "evaluate": (
        ["Confusion matrix", "Per class", "macro-F1", "Hardware billed"],
        ["confusion-matrix", "per-class"],
    ),
    "compare": (["GPU against TPU", "estimated cost"], ["accuracy", "time", "cost"]),
}


@pytest.fixture
def decks(comparison_run) -> dict[str, Path]:
    """The HTML Deck each task of the shared local hardware_comparison wrote."""
    return comparison_run.decks


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_each_task_writes_a_deck_with_its_sections_and_charts(decks, task):
    assert task in decks, f"no deck from {task}; decks: {sorted(decks)}"
    page = decks[task].read_text()
    sections, charts = EXPECTED[task]
    for title in sections:
        assert title in page, title
    for chart in charts:
        match = re.search(
            rf'<figure class="chart" data-chart="{chart}"><svg.*?</svg>\s*</figure>', page, re.DOTALL
        )
        assert match, f"{task}: chart {chart} is missing or not an SVG"
        assert match.group(0).count("<path") > 2, f"{task}: chart {chart} has nothing drawn"


OPEN_EVALUATION_TAB = """<script>
handleLinkClick([...document.querySelectorAll('#flyte-frame-tabs li')].find(li => li.textContent.trim() === 'Evaluation'));
</script>"""
REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Chromium (Debian package 'chromium'; `make test` installs it)"
)
def test_a_real_browser_renders_the_evaluation_deck(decks, tmp_path):
    # Open the page on its Evaluation tab, as a click on that tab would.
    page = tmp_path / "evaluate.html"
    page.write_text(decks["evaluate"].read_text().replace("</html>", OPEN_EVALUATION_TAB + "</html>"))
    url = page.as_uri()
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([CHROMIUM, *HEADLESS, *profile, "--dump-dom", url],
                         capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    evaluation = dom.split('class="active"')[-1]  # the content pane that is showing
    assert 'data-chart="confusion-matrix"' in evaluation and "<svg" in evaluation
    screenshot = tmp_path / "deck.png"
    subprocess.run([CHROMIUM, *HEADLESS, *profile, f"--screenshot={screenshot}", "--window-size=1280,1000", url],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    pixels = np.asarray(Image.open(screenshot).convert("RGB")).astype(int)
    red, blue = pixels[..., 0], pixels[..., 2]
    heatmap_cells = ((blue - red) > 60).mean()  # the confusion matrix's blue shades
    assert heatmap_cells > 0.005, f"no rendered heatmap in the screenshot ({heatmap_cells:.2%} blue pixels)"
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # charts, not just text


# What a spawned DDP worker does, in its order: load the task function the launcher sends (both torch
# tasks' here, one after the other), then write TensorBoard events.
DDP_WORKER = """
import pickle, sys
for task_function in pickle.loads(sys.stdin.buffer.read()):
    pickle.loads(task_function)
loaded = sorted(m for m in ("sklearn", "matplotlib", "tensorflow", "tasks.train_torch", "tasks.plumbing.decks")
                if m in sys.modules)
assert not loaded, f"every DDP worker would import {loaded} before its first step"
from tasks.core.models.torch_startup import tensorboard_without_tensorflow
from tasks.core.training.torch_training import event_writer
assert "tensorflow" not in sys.modules, "importing the training loop imported TensorFlow"
tensorboard_without_tensorflow()
board = event_writer(sys.argv[1])
board.add_scalar("loss/train", 0.5, 1)
board.close()
assert "tensorflow" not in sys.modules, "writing TensorBoard events imported TensorFlow"
"""


def test_ddp_workers_skip_task_definitions_charts_and_tensorflow_and_write_events_without_it(tmp_path):
    """Metrics run in evaluate and charts in the launcher, and the function the workers receive refers
    to `tasks.ddp_worker`, so each rank starts without any of them; its TensorBoard events are
    written without TensorFlow too."""
    import cloudpickle
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tasks.train_torch import train_torch, train_torch_multinode

    functions = [cloudpickle.dumps(task.task_function) for task in (train_torch, train_torch_multinode)]
    run = subprocess.run([sys.executable, "-c", DDP_WORKER, str(tmp_path / "board")],
                         input=pickle.dumps(functions), cwd=REPO, capture_output=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    events = EventAccumulator(str(tmp_path / "board"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/train")] == [(1, 0.5)]
