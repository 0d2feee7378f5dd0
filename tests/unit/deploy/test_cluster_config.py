"""The cluster-facing files: flyte.config.yaml, the README's commands, scheduled-run partitions."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from flytekit.configuration import Config

from tasks.core.data.schedule_uri import partition_uri
from tests.dependencies import REPO
from tests.unit.deploy.test_dockerfile import stages


def test_config_points_at_the_demo_cluster_without_credentials():
    config = Config.auto(config_file=str(REPO / "flyte.config.yaml"))
    assert config.platform.endpoint == "localhost:30080"
    assert config.platform.insecure is True
    text = (REPO / "flyte.config.yaml").read_text()
    live = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"secret|password|access-key|secret-key", live, re.IGNORECASE)


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_readme_cluster_commands_match_the_project():
    section = readme_section("Run on a Flyte cluster")
    built = set(re.findall(r"docker build --target ([\w-]+)", section))
    assert built == set(stages()) - {"base"}
    named = set(re.findall(r"--image ([\w-]+)=", section))
    assert named == built
    assert "pyflyte --config flyte.config.yaml register workflows" in section
    assert "--copy none" in section  # test_register_version.py: the images hold the code
    assert "make package" in section
    # Registration activates only the scheduled launch plans deploy/schedules.yaml completes;
    # --activate-launchplans would activate every one of them.
    assert "deploy/schedules.yaml" in section and "--activate-launchplans" not in section
    makefile = (REPO / "Makefile").read_text()
    assert "pyflyte --pkgs workflows package" in makefile
    assert "pyflyte --config flyte.config.yaml register workflows $(IMAGE_FLAGS)" in makefile


@pytest.mark.parametrize(
    "template, expected",
    [
        ("s3://data/events/dt={yesterday}/", "s3://data/events/dt=2026-11-21/"),
        ("gs://b/{date}.parquet", "gs://b/2026-11-22.parquet"),
        ("/data/{kickoff_time:%Y/%m/%d}/x.csv", "/data/2026/11/22/x.csv"),
        ("", ""),
    ],
)
def test_partition_from_kickoff_time(template, expected):
    assert partition_uri(template, datetime(2026, 11, 22, 2, 0)) == expected


def test_unknown_partition_field_is_named():
    with pytest.raises(ValueError, match=r"unknown fields \['day'\]"):
        partition_uri("s3://b/{day}/", datetime(2026, 11, 22))
