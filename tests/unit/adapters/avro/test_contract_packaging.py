"""The wheel ships schemas/ and projections/ byte for byte, and an installed evsched finds them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from evsched.adapters.contract import contract_dir

ROOT = Path(__file__).resolve().parents[4]
PACKAGED = "evsched/_contract"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("evsched-*.whl")
    return built


def _folder_files(folder: str) -> dict[str, bytes]:
    base = ROOT / folder
    return {
        f"{PACKAGED}/{folder}/{path.relative_to(base).as_posix()}": path.read_bytes()
        for path in sorted(base.rglob("*"))
        if path.is_file()
    }


def test_the_wheel_holds_exactly_the_contract_folders(wheel: Path) -> None:
    expected = {**_folder_files("schemas"), **_folder_files("projections")}
    with zipfile.ZipFile(wheel) as archive:
        shipped = {
            name: archive.read(name)
            for name in archive.namelist()
            if name.startswith(f"{PACKAGED}/") and not name.endswith("/")
        }

    assert any(name.endswith("JobEnqueued.avsc") for name in expected)
    assert shipped == expected


def test_an_installed_wheel_reads_its_packaged_schemas(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    probe = (
        "from evsched.adapters.contract import contract_dir\n"
        "from evsched.adapters.avro import decode_event, encode_event\n"
        "from evsched.core.events import LeaseExpired\n"
        "event = LeaseExpired(event_id='e', job_id='j', emitted_at=0, source='node-1', token=1)\n"
        "assert decode_event(encode_event(event)) == event\n"
        "print(contract_dir('schemas'))\n"
    )
    # PYTHONPATH goes before site-packages, so the unpacked wheel shadows the editable install.
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert Path(done.stdout.strip()) == site / PACKAGED / "schemas"


def test_a_source_checkout_falls_back_to_the_top_level_folders() -> None:
    assert Path(str(contract_dir("schemas"))) == ROOT / "schemas"
    assert Path(str(contract_dir("projections"))) == ROOT / "projections"


def test_the_wheel_ships_the_dashboards_templates_and_assets(wheel: Path) -> None:
    """``evsched api`` serves the dashboard after a plain install: no build, nothing fetched."""
    folder = ROOT / "src" / "evsched" / "api" / "dashboard"
    expected = {
        f"evsched/api/dashboard/{path.relative_to(folder).as_posix()}": path.read_bytes()
        for sub in ("templates", "static")
        for path in sorted((folder / sub).rglob("*"))
        if path.is_file()
    }
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name: archive.read(name) for name in expected if name in archive.namelist()}

    assert "evsched/api/dashboard/static/chart.umd.min.js" in expected
    assert shipped == expected
