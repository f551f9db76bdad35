#!/usr/bin/env bash
# Packs Glassbox.app into a compressed, read-only .dmg with an /Applications shortcut (macOS only).
#   installers/macos/make_dmg.sh dist/Glassbox.app dist/Glassbox-0.1.0-macos-arm64.dmg
# Signing and notarization are left to the release job: set GLASSBOX_CODESIGN_IDENTITY for
# PyInstaller's codesign step, then `xcrun notarytool submit` the .dmg.
set -euo pipefail
app="${1:?usage: make_dmg.sh APP_BUNDLE OUT_DMG}"
out="${2:?usage: make_dmg.sh APP_BUNDLE OUT_DMG}"
[ -d "$app" ] || { echo "make_dmg.sh: error: $app: no such .app bundle" >&2; exit 1; }
command -v hdiutil >/dev/null || { echo "make_dmg.sh: error: hdiutil not found (run on macOS)" >&2; exit 1; }
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp -R "$app" "$stage/"
ln -s /Applications "$stage/Applications"
rm -f "$out"
hdiutil create -volname Glassbox -srcfolder "$stage" -fs HFS+ -format UDZO -ov "$out"
echo "make_dmg.sh: wrote $out"
