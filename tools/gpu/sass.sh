#!/usr/bin/env bash
# Runs on one H100/H200 after `tools/gpu/build.sh ./backend/cuda/kernels`
# here (session 47): compiles the kernels afresh (an empty kernel cache;
# TestCompileLogs and TestKernelResources, with the NVRTC options of XOPTS
# when given), then writes the SASS of the kernels whose names match FUNCS
# (a regular expression; default the wgmma prefill's) from the cached
# CUBINs (cuobjdump) into sass/<kernel>-<entry>.sass (a kernel is in the
# bf16 and the f16 module: <entry> is its cache entry's), and a count of
# each kernel's instructions by opcode. Logs and SASS in logs-sass.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/sass.sh", carry [".devpack"]
export KILN_CACHE_DIR=/tmp/kiln-kernels-sass
source "$(dirname "$0")/env.sh"
rm -rf "$KILN_CACHE_DIR"
[ -n "${XOPTS:-}" ] && export KILN_NVRTC_OPTIONS=$XOPTS
kernels_test compile-logs -test.run 'TestCompileLogs|TestKernelResources'
grep -E '^(--- FAIL|FAIL|ok|PASS)|serialized|warning' "$out/compile-logs.log" | head -20
cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
mkdir -p "$out/sass"
# A cache entry: 80 bytes of header, then the payload (module.go's layout:
# a kind byte, for 'c' a log of 4-byte length, then the image).
python3 - "$KILN_CACHE_DIR" "$out/sass" <<'PY'
import os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for root, _, files in os.walk(src):
    for f in files:
        b = open(os.path.join(root, f), 'rb').read()[80:]
        if not b:
            continue
        if b[:1] == b'c':
            n = struct.unpack('<I', b[1:5])[0]
            img = b[5 + n:]
        elif b[:1] == b'C':
            img = b[1:]
        else:
            continue
        open(os.path.join(dst, f[:16] + '.cubin'), 'wb').write(img)
PY
for c in "$out"/sass/*.cubin; do
	"$cuobjdump" -sass "$c" >"${c%.cubin}.all" 2>&1 || echo "cuobjdump $c: rc=$?"
done
python3 - "$out/sass" "${FUNCS:-^prefill_wg[tp]?_128_128_[23]$}" <<'PY'
import collections, glob, os, re, sys
d, pat = sys.argv[1], re.compile(sys.argv[2])
for f in sorted(glob.glob(os.path.join(d, '*.all'))):
    name, body = None, []
    entry = os.path.basename(f)[:-len('.all')]
    def flush():
        if name and pat.search(name):
            open(os.path.join(d, name + '-' + entry + '.sass'), 'w').write(''.join(body))
            ops = collections.Counter()
            for l in body:
                m = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)', l)
                if m:
                    ops[m.group(1)] += 1
            print(name, entry, sum(ops.values()), 'instructions:', ', '.join('%s %d' % kv for kv in ops.most_common(40)))
    for l in open(f):
        m = re.match(r'\s*Function : (\S+)', l)
        if m:
            flush()
            name, body = m.group(1), []
        body.append(l)
    flush()
PY
rm -f "$out"/sass/*.cubin "$out"/sass/*.all
pack_out logs-sass.tgz
