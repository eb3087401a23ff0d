"""The wheel (scripts/build-wheel.sh) installs into a fresh environment and works there.

A new venv gets the wheel with pip (--no-deps, --no-index: no network); it sees the vLLM venv's
packages (numpy, torch) through a .pth file, as a user's own vLLM environment would hold them,
but not kdn's build tree. Its `kdn` must come from the wheel, load the libkdn inside it, and
talk to a real kdnd.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tools"))
import replicas  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, kdn
assert kdn.__file__.startswith(sys.prefix), kdn.__file__
d = kdn.model_desc(num_layers=1, num_kv_heads=1, head_dim=8, dtype=kdn.DType.F32, name="wheel", chunk_tokens=16)
with kdn.Client(sys.argv[1]) as c:
    m = c.register_model(d)
    import numpy as np
    assert m.store(list(range(32)), np.ones((2, *m.chunk_shape), dtype=np.float32)) == 2
    assert m.lookup(list(range(32))).hit_chunks == 2
print("ok", kdn.__file__)
"""


def test_wheel_installs_into_a_fresh_venv(tmp_path):
    py = replicas.python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(ROOT / "scripts" / "build-wheel.sh"), str(tmp_path / "dist")], env=env, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    wheel = Path(out)
    assert wheel.is_file() and wheel.name.startswith("kdn-")
    venv = tmp_path / "venv"
    subprocess.run([py, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "--python", vpy, "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                   env=env, check=True)
    site = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    Path(site, "vllm-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    k = replicas.Kdnd(str(tmp_path / "kdnd.sock"), arena="64M").start()
    try:
        r = subprocess.run([vpy, "-c", PROBE, k.socket], env=env, capture_output=True, text=True, cwd=tmp_path)
    finally:
        k.stop()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok " + str(venv))
