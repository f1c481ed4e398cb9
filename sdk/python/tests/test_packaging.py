"""`pip install ./sdk/python` gives a working package (in a virtual
environment that sees the system's torch, grpcio, numpy and xxhash)."""

import shutil
import subprocess
import sys

import pytest

from conftest import SDK


def test_pip_install_into_a_venv(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SDK, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    if subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)]).returncode != 0:
        pytest.skip("python3 -m venv is not available")
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", str(src)],
                   check=True, cwd=tmp_path)
    out = subprocess.run([str(py), "-c", "import rewind, rewind._pb.agent_pb2_grpc as g; "
                          "print(rewind.__file__); print(g.AgentStub.__name__)"],
                         check=True, cwd=tmp_path, capture_output=True, text=True).stdout
    assert str(venv) in out and "AgentStub" in out
    # The version is written once (rewind.__version__) and is the
    # distribution's; the py.typed marker and the messages' stubs ship.
    out = subprocess.run([str(py), "-c", "import os, importlib.metadata as md, rewind; "
                          "d = os.path.dirname(rewind.__file__); "
                          "print(md.version('rewind') == rewind.__version__, "
                          "os.path.exists(os.path.join(d, 'py.typed')), "
                          "os.path.exists(os.path.join(d, '_pb', 'agent_pb2.pyi')))"],
                         check=True, cwd=tmp_path, capture_output=True, text=True).stdout
    assert out.split() == ["True", "True", "True"], out


def test_import_does_not_import_torch():
    """torch takes seconds to import: `import rewind` (errors, the shard
    format) does without it, and the client brings it in when used."""
    code = ("import sys, rewind; assert 'torch' not in sys.modules, 'import rewind imported torch'; "
            "rewind.InvalidError, rewind.Header; assert 'torch' not in sys.modules; "
            "rewind.Client; assert 'torch' in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=SDK, capture_output=True, text=True).stdout
    assert out.strip() == "ok"
