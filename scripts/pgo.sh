#!/usr/bin/env bash
# Remake the compiled core's profile (rust/pgo/cais-core.profdata) for the profile-guided
# build (docs/core.md, "A profile-guided build"): build the core instrumented, exactly as
# `pip install` builds it (maturin runs `cargo rustc --lib --crate-type cdylib`, and the
# profile names functions by the symbols that build gives them), run
# scripts/pgo_workload.py on it, and merge what it counted.
#
# Needs llvm-profdata of the LLVM major version the Rust compiler is built on
# (`rustc -vV`): Debian's `llvm-NN` package or rustup's `llvm-tools` component.
#
#   scripts/pgo.sh            then: pip install -e .   (the build reads the new profile)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-$root/.venv/bin/python}
if [ $# -gt 0 ]; then
  echo "scripts/pgo.sh: takes no arguments (PYTHON=... chooses the interpreter; default .venv/bin/python)" >&2
  exit 2
fi
if [ ! -x "$python" ]; then
  echo "scripts/pgo.sh: no Python at $python; run the README's setup first, or set PYTHON" >&2
  exit 2
fi
major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=""
for candidate in "llvm-profdata-$major" "/usr/lib/llvm-$major/bin/llvm-profdata" \
    "$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata" llvm-profdata; do
  if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" --version | grep -q "LLVM version $major\."; then
    profdata=$candidate
    break
  fi
done
if [ -z "$profdata" ]; then
  echo "scripts/pgo.sh: no llvm-profdata of LLVM $major (the Rust compiler's); install Debian's llvm-$major or rustup's llvm-tools" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd rust && CARGO_TARGET_DIR="$work/target" cargo rustc --release --locked --lib --features extension-module \
  --crate-type cdylib -- -Cprofile-generate="$work/raw")
mkdir -p "$work/tree"
cp -r src/cais "$work/tree/"
rm -f "$work"/tree/cais/_core*.so
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
cp "$work/target/release/lib_core.so" "$work/tree/cais/_core$suffix"
(cd "$work" && PYTHONPATH="$work/tree" "$python" "$root/scripts/pgo_workload.py")
"$profdata" merge -o rust/pgo/cais-core.profdata "$work/raw"
"$python" scripts/pgo_workload.py --digest > rust/pgo/made-from.txt
echo "rust/pgo/cais-core.profdata: $(wc -c < rust/pgo/cais-core.profdata) bytes; reinstall (pip install -e .) to build with it"
