"""`pip install sdk/python` works offline: a fresh venv gets the package from
a copy of the source (a build writes into the tree it builds) with Debian's
setuptools and no package index, and imports it from site-packages."""

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1]


def main() -> int:
    missing = [pkg for module, pkg in (("venv", "python3-venv"), ("ensurepip", "python3-venv"),
                                       ("setuptools", "python3-setuptools"))
               if importlib.util.find_spec(module) is None]
    if missing:
        print(f"install_check: {sys.executable} lacks what pip needs offline; run: "
              f"apt-get install {' '.join(sorted(set(missing)))}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(SOURCE, work / "python", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(work / "venv")], check=True)
        python = work / "venv" / "bin" / "python"
        subprocess.run([str(python), "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", "--no-cache-dir", "--quiet", str(work / "python")], check=True, timeout=300)
        where = subprocess.run([str(python), "-c", "import cairn, cairn.errors; print(cairn.__file__)"],
                               cwd=work, check=True, capture_output=True, text=True).stdout.strip()
        installed = Path(where).parent
        if work / "venv" not in installed.parents or not (installed / "py.typed").exists():
            print(f"install_check: cairn imported from {where}, not from the venv with py.typed", file=sys.stderr)
            return 1
    print("install_check: pip installed cairn offline and imported it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
