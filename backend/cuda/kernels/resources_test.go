package kernels

import (
	"slices"
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
)

// noLocalMemory are kernels of the prefill and decode paths that must
// compile without local memory: an array indexed by a value the compiler
// cannot resolve (RoPE's pair index chosen by a runtime flag) or spilled
// registers turn a streaming kernel into one bound by local loads
// (rope_qkv_write_v in session 41: 116 registers, local loads at 1 byte of
// 32 a sector, the L2 at 83%). The many-row FP8 norm (add_rmsnorm_rq_w*)
// has none at two rows a block (57 registers in bf16, session 42); at four
// it spilled 48 bytes (bf16) or 64 (f16) under its __launch_bounds__.
// CI's TestWritersNoLocalDepot checks these kernels for local arrays in
// clang's PTX, which has no register cap; spills under a cap show here
// only.
var noLocalMemory = []string{
	"rope_qkv_write", "rope_qkv_write_r", "rope_qkv_write_v", "rope_qkv_write_n",
	"swiglu_packed", "swiglu_packed_v", "swiglu_packed_n", "swiglu_packed_qr",
	"fp8_quant_rows", "add_rmsnorm_rq_wf32", "add_rmsnorm_rq_wbf16",
}

// watchedResources are kernels whose resources are logged, not checked:
// the tensor-core prefill spills 16 or 112 bytes at 255 registers (session
// 41, H100). The tensor-parallel all-reduces report 96–224 bytes on the
// H200 after ar_region (session 42; clang's PTX still has depots in some,
// rolled loops over the ranks; ar_stuck, a call they make only when a
// peer is late past AR_TIMEOUT_NS, may add its frame: not yet told apart).
var watchedResources = []string{"prefill_mma_128", "prefill_mma1_128", "decode_mma_128",
	"decode_mma_h2_128", "decode_mma_h4_128", "peer_allreduce_bf16", "peer_lamport_bf16", "peer_lamport2_bf16", "peer_lamport_add_bf16",
	"peer_lamport2_norm_wbf16", "peer_scatter_rows"}

// TestKernelResources logs the registers and local memory of the kernels
// above as NVRTC compiled them for this device, and fails where one of
// noLocalMemory has local memory.
func TestKernelResources(t *testing.T) {
	for _, act := range []cu.DType{cu.BF16, cu.F16} {
		k := kern(t, act)
		names := append(slices.Clone(noLocalMemory), watchedResources...)
		if k.WG {
			names = append(names, "prefill_wg_128_128_2", "prefill_wg_128_64_2") // wgmma's prefill (sm_90a, session 44)
		}
		if k.TMA {
			names = append(names, "prefill_wgt_128_128_2", "prefill_wgt_128_64_2", "prefill_wgp_128_128_3") // its TMA builds (-DWG_TMA, sessions 45-47)
		}
		for _, name := range names {
			m, err := k.module(name)
			if err != nil {
				t.Errorf("%v %s: %v", act, name, err)
				continue
			}
			f, err := m.Function(name)
			if err != nil {
				t.Errorf("%v %s: %v", act, name, err)
				continue
			}
			regs, local, err := f.Resources()
			if err != nil {
				t.Errorf("%v %s: %v", act, name, err)
				continue
			}
			t.Logf("%v %-22s %3d registers, %4d bytes of local memory", act, name, regs, local)
			if local > 0 && slices.Contains(noLocalMemory, name) {
				t.Errorf("%v %s: %d bytes of local memory a thread", act, name, local)
			}
		}
	}
}

// TestCompileLogs logs what NVRTC (ptxas) said compiling each part of the
// kernels module, and fails where ptxas serialized a kernel's wgmma: the
// prefill's overlap of a stage's softmax with the wgmma in flight is then
// gone, with no error, only the warning "wgmma.mma_async instructions are
// serialized due to ...".
func TestCompileLogs(t *testing.T) {
	for _, act := range []cu.DType{cu.BF16, cu.F16} {
		k := kern(t, act)
		if k.WG { // the wgmma prefill's kernels are among the parts (sm_90a)
			for _, name := range []string{"prefill_wg_128_128_2", "prefill_wg_128_64_2"} {
				if _, err := k.module(name); err != nil {
					t.Fatalf("%v %s: %v", act, name, err)
				}
			}
		}
		for _, m := range k.Modules() {
			if m.Log == "" {
				continue
			}
			t.Logf("%v %s (cached %v):\n%s", act, m.Name(), m.Hit, m.Log)
			for _, line := range strings.Split(m.Log, "\n") {
				if strings.Contains(line, "wgmma") && strings.Contains(line, "serialized") {
					t.Errorf("%v %s: %s", act, m.Name(), line)
				}
			}
		}
	}
}
