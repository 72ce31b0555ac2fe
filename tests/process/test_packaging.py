"""The repository's folders install under one `tapfix` namespace, data files included."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_installs_under_tapfix_with_schemas(tmp_path):
    """A non-editable install carries the schemas and puts nothing named `proxy` at the top."""
    import subprocess
    import sys
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tapfix-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops <= {"tapfix", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    assert "tapfix/schemas/config.schema.json" in names
    assert "tapfix/proxy/cli/main.py" in names and "tapfix/addons/recorder.py" in names
