"""An installed wheel works away from the checkout: it carries the dashboards, alert rules, runbooks and default
policies, and the commands that read them find them from any directory.

The wheel is built from a copy of the source tree (no build output lands in the checkout) and installed with
``--no-deps`` into a new virtual environment outside the repository. That environment reaches Pitstop's
dependencies through a ``.pth`` file naming this environment's site-packages, so nothing is downloaded; the
editable install of this environment is not seen there (a ``.pth`` file is only read from a site directory), so
every command below runs the wheel's code and files. Every command runs in a directory outside the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from bench.harness.http import probe
from tests.helpers import free_port, http_ok, wait_until
from tests.observability.fake_grafana import FakeGrafana

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]  # one wheel built and installed per run

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {"dashboards": ROOT / "dashboards", "alerts": ROOT / "alerts", "runbooks": ROOT / "runbooks",
           "deploy": ROOT / "deploy", "policies": ROOT / "controlplane" / "policy" / "defaults"}
TOKEN = "grafana-service-account-token"


@dataclass(frozen=True)
class Installed:
    venv: Path
    site_packages: Path
    elsewhere: Path  # a working directory outside the checkout
    env: dict[str, str]

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / argv[0]), *argv[1:]], cwd=self.elsewhere, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def _source_copy(destination: Path) -> Path:
    """The source tree as a fresh clone would have it: no virtual environments, caches or earlier builds."""

    def ignored(_directory: str, names: list[str]) -> set[str]:
        return {n for n in names if n.startswith(".") or n in ("build", "dist", "__pycache__")
                or n.endswith(".egg-info")}

    # symlinks=True: pitstop/share/ links to the top-level folders, and the build must follow those links.
    shutil.copytree(ROOT, destination, symlinks=True, ignore=ignored)
    return destination


def _isolation_flags() -> list[str]:
    """Build with this environment's backend when it meets ``build-system.requires`` (offline); otherwise pip
    sets up an isolated build environment with it."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]["requires"]
    for text in requires:
        requirement = Requirement(text)
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            return []
        if not requirement.specifier.contains(version, prereleases=True):
            return []
    return ["--no-build-isolation"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    source = _source_copy(work / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", *_isolation_flags(),
                            "--wheel-dir", str(work / "dist"), str(source)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (work / "dist").glob("pitstop-*.whl")

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # Installed before the .pth below exists, so pip sees an empty environment and never this one's pitstop.
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    site_packages = Path(subprocess.check_output([str(python), "-c", "import sysconfig; "
                                                  "print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site_packages / "pitstop-test-dependencies.pth").write_text("".join(f"{p}\n" for p in ours))

    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith(("PITSTOP_", "GRAFANA_"))}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    return Installed(venv, site_packages, elsewhere, env)


def _relative_files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_the_commands_run_the_installed_code_not_the_checkout(installed: Installed) -> None:
    done = installed.run("python", "-c", "import agent, controlplane, enginesim, pitstop; "
                         "print('\\n'.join(m.__file__ for m in (agent, controlplane, enginesim, pitstop)))")
    assert done.returncode == 0, done.stderr
    for where in done.stdout.split():
        assert Path(where).is_relative_to(installed.site_packages), where


def test_the_wheel_carries_every_shipped_file(installed: Installed) -> None:
    done = installed.run("pitstop", "files")
    assert done.returncode == 0, done.stderr
    found = dict(line.split("\t") for line in done.stdout.splitlines())
    assert sorted(found) == sorted(SHIPPED)
    for name, checkout in SHIPPED.items():
        directory = Path(found[name])
        assert directory.is_relative_to(installed.site_packages), (name, directory)
        assert _relative_files(directory) == _relative_files(checkout), name
    assert installed.run("pitstop", "files", "alerts").stdout.strip() == found["alerts"]
    rules = "pitstop-rules.yml"
    assert (Path(found["alerts"]) / rules).read_bytes() == (SHIPPED["alerts"] / rules).read_bytes()


def test_policy_check_checks_the_shipped_defaults(installed: Installed) -> None:
    shipped = len(list(SHIPPED["policies"].glob("*.yaml")))
    done = installed.run("pitstop", "policy", "check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {shipped} policies in {shipped} file(s)")


def test_dashboards_push_uploads_the_shipped_dashboards(installed: Installed) -> None:
    expected = {}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        expected[board["uid"]] = board
    with FakeGrafana(TOKEN) as grafana:
        done = installed.run("pitstop", "dashboards", "push", "--grafana-url", grafana.url, "--token", TOKEN)
    assert done.returncode == 0, done.stderr
    assert sorted(grafana.state.dashboards) == sorted(expected)
    for uid, body in grafana.state.dashboards.items():
        assert body["dashboard"] == expected[uid] | {"id": None}
        assert body["folderUid"] == "pitstop"
    assert [f["title"] for f in grafana.state.folders] == ["Pitstop"]


@pytest.fixture
def server(installed: Installed) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(installed.venv / "bin" / "pitstop"), "server", "--port", str(port)],
                            cwd=installed.elsewhere, env=installed.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: http_ok(f"{url}/healthz") or proc.poll() is not None, 60, what="the server to answer")
        assert proc.poll() is None, proc.communicate()[0]
        yield url
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_the_server_with_no_config_runs_the_shipped_policies(installed: Installed, server: str) -> None:
    answer = probe.get(f"{server}/v1/policies", timeout=10).json()
    assert answer["errors"] == []
    assert {p["name"] for p in answer["policies"]} == {p.stem for p in SHIPPED["policies"].glob("*.yaml")}
    assert [Path(s).is_relative_to(installed.site_packages) for s in answer["sources"]] == [True]
    # Its state went where the defaults put it: under the working directory, not the checkout.
    assert (installed.elsewhere / ".pitstop" / "pitstop.db").is_file()
