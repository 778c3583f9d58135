"""Static checks of examples/docker (Docker cannot run in the test
environment): the Dockerfile installs exactly SHMCACHE_BUILD_PACKAGES, builds
with the demo's function and runs the demo, and compose gives /dev/shm room."""

import re
import subprocess

import yaml

from conftest import ROOT

DOCKER = ROOT / "examples" / "docker"


def build_packages():
    out = subprocess.run(["bash", "-c", "source scripts/lib/common.sh && "
                          "printf '%s\\n' \"${SHMCACHE_BUILD_PACKAGES[@]}\""],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_dockerfile_installs_the_build_packages_and_runs_the_demo():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM debian:12\b", text, re.M)
    joined = text.replace("\\\n", " ")
    (install,) = [l for l in joined.splitlines() if "apt-get install" in l]
    words = install.split("apt-get install", 1)[1].split("&&")[0].split()
    assert {w for w in words if not w.startswith("-")} == build_packages()
    assert "build_demo build" in text
    assert re.search(r'^CMD \["bash", "scripts/demo.sh"\]', text, re.M)


def test_compose_gives_the_container_shm_room():
    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    svc = spec["services"]["shmcache-demo"]
    assert svc["build"]["dockerfile"] == "examples/docker/Dockerfile"
    size = svc["shm_size"]
    assert re.fullmatch(r"\d+gb", size) and int(size[:-2]) >= 1
