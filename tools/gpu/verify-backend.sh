#!/usr/bin/env bash
# Runs on one GPU after tools/gpu/build.sh ./backend/cuda here: the whole
# backend/cuda test package (within 420 s), its failures and last lines.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/verify-backend.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
export KILN_SHARED_DIR=$PWD/.devbin/shared
t0=$(date +%s)
(cd backend/cuda && timeout 420 ../../.devbin/backend_cuda.test -test.count=1 -test.timeout 415s) >"$out/backend-all.log" 2>&1
echo "backend/cuda: rc=$? in $(($(date +%s) - t0)) s"
grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- FAIL|panic' "$out/backend-all.log" | head -20
tail -3 "$out/backend-all.log"
