#!/usr/bin/env bash
# Builds the GPU test binaries and the kiln binary (for tools/gpu/bench.sh)
# here (no CUDA toolkit needed: CUDA is loaded at run time) into .devbin/, to
# be carried to the GPU machine and run there with tools/gpu/run.sh. The
# binaries (about 60 MB) and the tree together pass the device tool's 64 MiB,
# so they are also packed into .devpack/bin.tar.xz (about 25 MB): carry
# [".devpack"] and start the command with `tar xJf .devpack/bin.tar.xz &&`.
#   [BASE=<rev>] tools/gpu/build.sh [packages...]   (default ./backend/cuda/...)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devbin
rm -f .devbin/*.test
pkgs=("${@:-./backend/cuda/...}")
for pkg in $(go list "${pkgs[@]}"); do
	name=$(echo "${pkg#kiln/}" | tr / _)
	# Skip packages without test files.
	if [ -z "$(go list -f '{{join .TestGoFiles ""}}{{join .XTestGoFiles ""}}' "$pkg")" ]; then continue; fi
	CGO_ENABLED=1 go test -c -ldflags=-s\ -w -o ".devbin/$name.test" "$pkg"
	echo "built .devbin/$name.test"
done
CGO_ENABLED=1 go build -ldflags="-s -w" -o .devbin/kiln ./cmd/kiln
echo "built .devbin/kiln"
# BASE=<rev>: also kiln as of that revision, .devbin/kiln-base, for
# tools/gpu/ab.sh to compare with this tree's on one machine.
rm -f .devbin/kiln-base
if [ -n "${BASE:-}" ]; then
	root=$(pwd)
	wt=$(mktemp -d)
	git worktree add --detach "$wt" "$BASE" >/dev/null
	(cd "$wt" && CGO_ENABLED=1 go build -ldflags="-s -w" -o "$root/.devbin/kiln-base" ./cmd/kiln)
	git worktree remove --force "$wt"
	echo "built .devbin/kiln-base ($BASE: $(git rev-parse --short "$BASE"))"
fi
# The King James Bible for tools/gpu/quality-big.sh (train.py's input), when
# Debian's bible-kjv is installed here.
rm -rf .devbin/data
if command -v bible >/dev/null; then
	mkdir -p .devbin/data/kjv
	(cd /tmp && bible -f "Gen1:1-Rev22:21") >.devbin/data/kjv/kjv.txt
	echo "wrote .devbin/data/kjv/kjv.txt"
fi
# The shared test data the GPU tests read (../shared does not travel to the
# GPU machine; tools/gpu/run.sh points KILN_SHARED_DIR here).
if [ -d ../shared/models/stories260K ]; then
	mkdir -p .devbin/shared/models
	cp -r ../shared/models/stories260K .devbin/shared/models/
	echo "copied ../shared/models/stories260K to .devbin/shared"
fi
# The tokenizers of the random models' vocabularies (tools/gpu/env.sh).
for t in llama3.2-bpe gpt2; do
	if [ -f ../shared/tokenizers/$t/tokenizer.json ]; then
		mkdir -p .devbin/shared/tokenizers/$t
		cp ../shared/tokenizers/$t/tokenizer.json .devbin/shared/tokenizers/$t/
	else
		echo "warning: no ../shared/tokenizers/$t/tokenizer.json: the serving scripts need it" >&2
	fi
done
# The corpus tools/gpu/spec-bench.sh takes its prompts from.
if [ -f ../shared/corpora/war-and-peace.txt ]; then
	mkdir -p .devbin/shared/corpora
	cp ../shared/corpora/war-and-peace.txt .devbin/shared/corpora/
fi
# The binaries must need nothing from CUDA at link time.
for b in .devbin/*.test .devbin/kiln*; do
	if ldd "$b" 2>/dev/null | grep -Ev 'linux-vdso|libc\.so|libdl\.so|libpthread\.so|ld-linux|libm\.so|libresolv\.so' | grep -q .; then
		echo "unexpected shared library dependency in $b:" >&2
		ldd "$b" >&2
		exit 1
	fi
done
mkdir -p .devpack
rm -f .devpack/bin.tar.xz
tar cJf .devpack/bin.tar.xz .devbin
echo "packed .devpack/bin.tar.xz ($(du -h .devpack/bin.tar.xz | cut -f1))"
# The device tool carries at most 64 MiB: the tracked tree and the pack.
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
pack=$(stat -c %s .devpack/bin.tar.xz)
if [ $((tree + pack)) -gt $((64 << 20)) ]; then
	echo "warning: the tree ($((tree >> 20)) MiB) and the pack ($((pack >> 20)) MiB) pass the device tool's 64 MiB:" \
		"repack what the script needs, e.g. XZ_OPT=-9 tar cJf .devpack/bin.tar.xz --exclude=.devbin/data --exclude=.devbin/shared/corpora .devbin" >&2
fi
