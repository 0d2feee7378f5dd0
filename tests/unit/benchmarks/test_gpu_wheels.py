"""The wheels a GPU machine without Flyte is given for `pyflyte run` (benchmarks/gpu_wheels.py): what a run
imports, traced in every process it starts; what travels; the download for another platform; the
offline install the GPU check makes of them."""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
import textwrap

import pytest

from benchmarks import gpu_wheels


def test_a_traced_run_reports_what_its_child_processes_imported_too():
    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import tomllib'], check=True)"
    modules = gpu_wheels.imported_by_a_run([sys.executable, "-c", f"import csv; {child}"])
    assert {"csv", "subprocess", "tomllib"} <= modules


def test_a_traced_run_that_fails_says_so_with_its_output():
    with pytest.raises(SystemExit, match=r"(?s)the traced run failed \(1\).*no_such_module"):
        gpu_wheels.imported_by_a_run([sys.executable, "-c", "import no_such_module"])


def test_modules_map_to_their_installed_distributions_and_this_project_is_left_out():
    found = gpu_wheels.distributions_of({"yaml", "flytekit", "tasks", "json"})
    assert found == {"PyYAML": metadata.version("PyYAML"), "flytekit": metadata.version("flytekit")}


def test_a_namespace_package_declared_as_a_path_maps_to_its_distribution():
    """flyteidl's generated code imports protoc_gen_openapiv2, whose wheel declares its top level as
    'protoc_gen_openapiv2/options'."""
    assert "protoc-gen-openapiv2" in gpu_wheels.distributions_of({"protoc_gen_openapiv2"})


def test_what_the_image_has_stays_and_the_rest_travels():
    versions = {"flytekit": "1", "torch": "2", "Scikit_Learn": "3", "nvidia-nccl-cu13": "4", "mashumaro": "5"}
    assert gpu_wheels.to_carry(versions) == {"flytekit": "1", "mashumaro": "5"}


def test_the_download_pins_each_version_for_the_machines_python_and_every_linux_tag(tmp_path):
    command = gpu_wheels.download_command({"flytekit": "1.16.31"}, "3.12", tmp_path)
    assert command[command.index("--python-version") + 1] == "3.12"
    assert "flytekit==1.16.31" in command and "--no-deps" in command and "--only-binary=:all:" in command
    platforms = {command[i + 1] for i, flag in enumerate(command) if flag == "--platform"}
    assert {"manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"} <= platforms


def wheel(folder, name: str, module: str) -> None:
    """A minimal pure-Python wheel of one module, written with pip's own build backend."""
    source = folder / f"src-{name}"
    (source / module).mkdir(parents=True)
    (source / module / "__init__.py").write_text("VALUE = 42\n")
    (source / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [project]
        name = "{name}"
        version = "1.0"
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        """)
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(folder), str(source)],
        check=True,
    )  # fmt: skip


@pytest.mark.heavy  # builds and installs a wheel with pip: the GPU check's harness, as its other tests
@pytest.mark.slow
def test_carried_wheels_are_installed_offline_where_flytekit_is_missing(tmp_path, monkeypatch):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    wheel(wheels, "carried-example", "carried_example")
    monkeypatch.setattr(gpu_wheels.importlib.util, "find_spec", lambda name: None)  # as without flytekit
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    said = gpu_wheels.use_carried_wheels(wheels, site)
    assert said == "installed 1 wheels from wheels into site"
    assert (site / "carried_example" / "__init__.py").exists()
    assert sys.path[0] == str(site)
    child = subprocess.run([sys.executable, "-c", "import carried_example; print(carried_example.VALUE)"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert child.stdout.strip() == "42"  # the processes it starts see them too


@pytest.mark.heavy  # runs pip, as the install above
def test_wheels_that_do_not_install_are_reported_and_the_path_is_left_alone(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_text("not a zip file")
    monkeypatch.setattr(gpu_wheels.importlib.util, "find_spec", lambda name: None)  # as without flytekit
    before = list(sys.path)
    said = gpu_wheels.use_carried_wheels(wheels, tmp_path / "site")
    assert said.startswith("could not install the wheels in wheels (pip exited ")
    assert sys.path == before


def test_nothing_is_installed_where_flytekit_is_there_or_no_wheels_were_carried(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "example-1.0-py3-none-any.whl").write_text("not read")
    assert gpu_wheels.use_carried_wheels(wheels, tmp_path / "site") == ""  # flytekit is installed here
    assert not (tmp_path / "site").exists()
