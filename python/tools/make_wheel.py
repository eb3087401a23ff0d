"""Packs a staged `kdn` package folder into a wheel (PEP 427), with no build backend and no network.

    python make_wheel.py STAGE OUT_DIR [--version 0.1.0]

STAGE holds the package as it is to be installed: STAGE/kdn/... (the Python files, the compiled
module, and the shared libraries it loads through its $ORIGIN rpath). scripts/build-wheel.sh
stages it from kdn's own build. The wheel is tagged for this interpreter and platform
(cpXY-cpXY-linux_<arch>): the module is compiled for one Python, and the libraries for one
platform; prints the wheel's path.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import platform
import sys
import zipfile
from pathlib import Path

SUMMARY = "Python client of kdnd, the per-node KV-cache sidecar, and its vLLM KV connector"


def tag() -> str:
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{py}-{py}-linux_{platform.machine()}"


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def metadata(version: str) -> dict[str, str]:
    return {
        "METADATA": (f"Metadata-Version: 2.1\nName: kdn\nVersion: {version}\nSummary: {SUMMARY}\n"
                     "Requires-Python: >=3.10\nRequires-Dist: numpy\n"
                     "Provides-Extra: torch\nRequires-Dist: torch; extra == \"torch\"\n"),
        "WHEEL": f"Wheel-Version: 1.0\nGenerator: kdn make_wheel.py\nRoot-Is-Purelib: false\nTag: {tag()}\n",
        "top_level.txt": "kdn\n",
    }


def package_files(stage: Path) -> list[Path]:
    files = sorted(p for p in (stage / "kdn").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    if not any(p.name.startswith("_kdn") and p.suffix == ".so" for p in files):
        raise SystemExit(f"make_wheel: no compiled module kdn/_kdn*.so under {stage}")
    return files


def write(stage: Path, out_dir: Path, version: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"kdn-{version}-{tag()}.whl"
    info = f"kdn-{version}.dist-info"
    record: list[str] = []
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for path in package_files(stage):
            name = path.relative_to(stage).as_posix()
            data = path.read_bytes()
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # the same bytes from the same build
            zi.external_attr = (os.stat(path).st_mode & 0o777 | 0o100000) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            record.append(f"{name},{digest(data)},{len(data)}")
        for fname, text in metadata(version).items():
            data = text.encode()
            z.writestr(f"{info}/{fname}", data)
            record.append(f"{info}/{fname},{digest(data)},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--version", default="0.1.0")
    a = p.parse_args(argv)
    print(write(a.stage, a.out_dir, a.version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
