"""`baechi place` never imports TensorFlow, and `baechi --help` stays light."""

import os
import subprocess
import sys

CNN = os.path.join(os.path.dirname(__file__), "..", "testdata", "cnn.pb")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_place_does_not_import_tensorflow(tmp_path):
    mods = _modules_after(
        "from baechi_cli.cli.commands import main\n"
        f"main(['place', {CNN!r}, '--devices', '2x8GB', '-q', '-o', {str(tmp_path / 'p.pb')!r}],"
        " standalone_mode=False)"
    )
    assert "baechi_cli.app.place" in mods
    assert not any(m == "tensorflow" or m.startswith("tensorflow.") for m in mods)


def test_help_imports_only_the_cli():
    mods = _modules_after("from baechi_cli.cli.commands import main")
    heavy = {"tensorflow", "numpy", "google.protobuf", "ortools", "networkx", "onnx", "rich", "yaml"}
    assert not heavy & mods
