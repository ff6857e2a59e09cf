package cu

import (
	"strings"
	"testing"
)

// TestTiledMapCheck (no GPU): the tensor maps the driver would refuse are
// refused first, naming what is wrong; the paged KV cache's map (head dim,
// kv heads, slots; a box of 64 head dims of one head over 16 slots, 128-byte
// swizzle) passes.
func TestTiledMapCheck(t *testing.T) {
	kv := func() TiledMap {
		return TiledMap{Elem: 2, Base: 0x10000, Dims: []uint64{128, 8, 4096}, Strides: []uint64{256, 2048},
			Box: []uint32{64, 1, 16}, Swizzle: 128}
	}
	if err := kv().Check(); err != nil {
		t.Fatalf("the KV cache's map: %v", err)
	}
	for _, c := range []struct {
		want string
		edit func(*TiledMap)
	}{
		{"element of 3 bytes", func(m *TiledMap) { m.Elem = 3 }},
		{"6 dimensions", func(m *TiledMap) {
			m.Dims, m.Strides, m.Box = []uint64{8, 2, 2, 2, 2, 2}, []uint64{16, 32, 64, 128, 256}, []uint32{8, 1, 1, 1, 1, 1}
		}},
		{"3 strides", func(m *TiledMap) { m.Strides = append(m.Strides, 1<<20) }},
		{"not 16-byte aligned", func(m *TiledMap) { m.Base += 8 }},
		{"dimension 2 of 0", func(m *TiledMap) { m.Dims[2] = 0 }},
		{"box of 257", func(m *TiledMap) { m.Dims[2], m.Box[2] = 1000, 257 }},
		{"box of 16 elements in dimension 1 of 8", func(m *TiledMap) { m.Box[1] = 16 }},
		{"stride of 248 bytes", func(m *TiledMap) { m.Strides[0] = 248 }},
		{"stride of 2000 bytes", func(m *TiledMap) { m.Strides[1] = 2000 }},
		{"stride of 1024 bytes for dimension 2", func(m *TiledMap) { m.Strides[1] = 1024 }}, // under the 8 heads' 2,048
		{"box row of 40 bytes", func(m *TiledMap) { m.Box[0] = 20 }},
		{"swizzle of 100", func(m *TiledMap) { m.Swizzle = 100 }},
		{"256 bytes in a 128-byte swizzle", func(m *TiledMap) { m.Box[0] = 128 }},
	} {
		m := kv()
		c.edit(&m)
		err := m.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.want, err)
		}
	}
}
