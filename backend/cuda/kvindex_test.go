package cuda

import (
	"strings"
	"testing"

	"kiln/backend"
)

// TestCheckKVIndex (no GPU): a KV cache's block size must be the one the
// attention kernels were built for (any, where built for none), and its
// rows (a layer's slots times kv heads) must fit kv_row's 32-bit index.
func TestCheckKVIndex(t *testing.T) {
	spec := func(blocks, bs, kvHeads int) backend.KVSpec {
		return backend.KVSpec{Layers: 32, Blocks: blocks, BlockSize: bs, KVHeads: kvHeads, HeadDim: 128}
	}
	for _, c := range []struct {
		spec  backend.KVSpec
		built int
		want  string // "" for no error, else a part of it
	}{
		{spec(1000, 16, 8), 16, ""},
		{spec(1000, 24, 8), 0, ""},
		{spec(1000, 32, 8), 16, "32-token blocks for attention kernels built for 16-token blocks"},
		{spec(1<<24, 16, 8), 16, ""},         // 2³¹ rows: the last row's index 2³¹ − 1 fits
		{spec(1<<24+1, 16, 8), 16, "32-bit"}, // one block more
		{spec(1<<22, 128, 8), 0, "32-bit"},   // built for any size: the same bound
	} {
		err := checkKVIndex(c.spec, c.built)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v, built for %d: %v", c.spec, c.built, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v, built for %d: %v, want an error with %q", c.spec, c.built, err, c.want)
		}
	}
}
