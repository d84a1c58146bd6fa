#!/usr/bin/env bash
# Build CACTI 7 from the sources in the hwcomponents-cacti sdist (PyPI), for
# `cais reproduce cost` and tests/test_cost.py (docs/switch-cost.md).
#
# Why not `pip install -e '.[cost]'`: hwcomponents and hwcomponents-cacti require
# Python >= 3.12 (this project supports 3.11), and the wheel's prebuilt binary needs a
# newer C library than Debian 12's. The sdist carries CACTI's C++ sources; this script
# fetches it (pinned by SHA-256, the same pin as cais.cost.cacti.SDIST), applies the two
# source fixes hwcomponents-cacti's own Makefile applies for newer compilers, and runs
# `make opt` (g++ and make; a minute on 2 cores).
#
#   scripts/build_cacti.sh [DEST]     DEST defaults to $CAIS_CACTI_DIR or ~/.cache/cais/cacti
#
# cais.cost.cacti.find_cacti() then finds DEST/cacti (or set CAIS_CACTI to the binary).
set -euo pipefail

VERSION=1.0.40
URL=https://files.pythonhosted.org/packages/95/95/646a0b1c6559e8e6dc7845e50bf58929422c17a2981108ff27d3869388e7/hwcomponents_cacti-${VERSION}.tar.gz
SHA256=14d6541f28e7caabe2416ef29d0afc447885622c2657f6bcc69d00a15450d2bd
DEST=${1:-${CAIS_CACTI_DIR:-$HOME/.cache/cais/cacti}}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if command -v curl >/dev/null; then
  curl -fsSL -o sdist.tar.gz "$URL"
else
  python3 -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], 'sdist.tar.gz')" "$URL"
fi
echo "$SHA256  sdist.tar.gz" | sha256sum -c --quiet -
tar xzf sdist.tar.gz
cd "hwcomponents_cacti-${VERSION}/hwcomponents_cacti/cacti"
# hwcomponents-cacti's Makefile (target build): a space a C++11 compiler needs between a
# string literal and a macro, and a pointer fix in nuca.cc; -m64 dropped for other hosts
sed -i 's/"\."VER_/"." VER_/g' io.cc
sed -i 's/\*dt = &(g_tp\.peri_global)/*dt/' nuca.cc
sed -i 's/-m64//g;s/-gstabs+//g' cacti.mk
make opt -j"$(nproc)" >build.log 2>&1 || { tail -20 build.log; exit 1; }
# CACTI reads its technology files (tech_params/, contention.dat) from its working folder
mkdir -p "$DEST"
cp -r cacti contention.dat tech_params "$DEST/"
cp ../../license.txt "$DEST/LICENSE-hwcomponents-cacti.txt" 2>/dev/null || true
echo "CACTI built: $DEST/cacti"
